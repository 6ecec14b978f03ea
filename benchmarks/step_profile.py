"""Where parascale's training step spends its time: torch.profiler over a fixed number of real
steps (``training.loop.step.take_step`` on the run its set-up builds) of a small GPT on the
shakespeare corpus, one worker, in this process; the operators sorted by their own CPU time.

The table shows every operator and runtime call the step makes: on CUDA, a host-device
synchronisation is a row of its own (cudaStreamSynchronize, cudaEventSynchronize, a
cudaMemcpyAsync from pageable memory), and so is each small kernel parascale adds to the
model's. ``--plain`` profiles a hand-written step of the same model, batches and optimizer
instead, for comparison.

    .venv/bin/python benchmarks/step_profile.py [--steps 20] [--device cpu|cuda] [--plain]
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile
from world_of_one import world_of_one

from parascale.config import TrainConfig
from parascale.training.loop import setup, step
from parascale.training.observe.measure import LossTally

SHAPE = dict(context=64, gpt_layers=4, gpt_heads=4, gpt_width=128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=12)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--plain", action="store_true", help="profile a hand-written step")
    parser.add_argument("--rows", type=int, default=15)
    args = parser.parse_args()
    cfg = TrainConfig.of(model="gpt", dataset="shakespeare", batch_size=args.batch,
                      steps=10_000, optimizer="adamw", lr=1e-3, adam_beta2=0.99,
                      weight_decay=0.1, precision=args.precision, device=args.device,
                      gpus=(0,) if args.device == "cuda" else None, save_model=False,
                      out=None, threads=1, evaluate_test=False, val_fraction=0.001, **SHAPE)
    with world_of_one(args.device) as world:
        run = setup.set_up(cfg, world, None)
        train = run.bundle.train
        count = args.warmup + args.steps
        order = [torch.randperm(len(train))[:args.batch] for _ in range(count)]
        batches = iter(train.batches(order, world.device, train=True))
        losses = LossTally(world.device)
        net, optimizer, loss_of = run.net, run.optimizer, run.task.loss

        def one() -> None:
            if not args.plain:
                step.take_step(run, batches, losses)
                return
            batch = next(batches)
            with torch.autocast(world.device.type, dtype=torch.bfloat16,
                                enabled=args.precision == "bf16"):
                loss = loss_of(net, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        for _ in range(args.warmup):
            one()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                               if args.device == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                one()
            run.divergence.settle(final=True)
            if args.device == "cuda":
                torch.cuda.synchronize()
        run.phases.clock.flush()
    what = "a hand-written step" if args.plain else "parascale's step (take_step)"
    print(f"{what}: gpt {SHAPE['gpt_layers']}x{SHAPE['gpt_heads']}x{SHAPE['gpt_width']}, "
          f"context {SHAPE['context']}, batch {args.batch}, AdamW, {args.precision}, "
          f"{args.steps} steps after {args.warmup}, on {args.device}; torch {torch.__version__}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                    max_name_column_width=40))


if __name__ == "__main__":
    main()
