"""The trainer's own per-step work, without start-up, epochs or machine load in the way.

One process, one worker (a world of one, gloo on loopback), LeNet on digits at batch 32 unless
told otherwise: parascale's real step (``training.loop.step.take_step``, on the run its set-up
builds: strategy, clock, divergence check, noise scale, fault hooks, profiler hooks, data
pipeline) and a plain hand-written step (index a pre-normalised tensor, forward, loss,
zero_grad, backward, step) on the same model and optimizer, in alternating blocks of steps.
Each block reports its CPU time per step (``time.process_time_ns``: the one thread's own time,
so waiting for a core that other processes hold does not count) and its wall time per step. The figure is plain /
parascale (a throughput ratio), per block pair, as the median over pairs.

    .venv/bin/python benchmarks/step_overhead.py [--model lenet] [--rounds 21] [--steps 300]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from world_of_one import world_of_one

from parascale.config import TrainConfig
from parascale.training.loop import setup, step
from parascale.training.observe.measure import LossTally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    cfg = TrainConfig.of(model=args.model, dataset="digits", batch_size=32, epochs=10_000,
                         lr=0.05, save_model=False, out=None, threads=1)
    with world_of_one() as world:
        run = setup.set_up(cfg, world, None)  # no plan handed over: the worker makes its own
        train = run.bundle.train
        order = [torch.randperm(len(train))[:32] for _ in range(args.steps)]
        x = (train.x - train.x.mean()) / train.x.std()  # normalised once, as by hand
        y = train.y
        net, optimizer, loss_of = run.net, run.optimizer, run.task.loss

        def plain() -> tuple[int, int]:
            cpu, wall = time.process_time_ns(), time.perf_counter_ns()
            for idx in order:
                loss = loss_of(net, (x[idx], y[idx]))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            return time.process_time_ns() - cpu, time.perf_counter_ns() - wall

        def parascale() -> tuple[int, int]:
            batches = iter(train.batches(order, world.device, train=True,
                                         generator=torch.Generator().manual_seed(0)))
            losses = LossTally(world.device)
            cpu, wall = time.process_time_ns(), time.perf_counter_ns()
            for _ in order:
                step.take_step(run, batches, losses)
            run.divergence.settle(final=True)  # the epoch's end decides its last step
            spent = time.process_time_ns() - cpu, time.perf_counter_ns() - wall
            run.phases.clock.flush()
            run.phases.clock.restart()
            losses.total()
            return spent

        pairs = []
        for r in range(args.rounds):  # A B, B A, ...: drifting load hits both alike
            first, second = (plain, parascale) if r % 2 == 0 else (parascale, plain)
            got = {first: first(), second: second()}
            pairs.append((got[plain], got[parascale]))
    per_step = args.steps * 1e3  # ns per block -> µs per step
    cpu_ratio = [p[0] / q[0] for p, q in pairs]
    wall_ratio = [p[1] / q[1] for p, q in pairs]
    print(f"{args.model} on digits, batch 32, one worker, one thread; {args.rounds} block pairs "
          f"of {args.steps} steps")
    print(f"CPU time per step: plain {statistics.median(p[0] for p, _ in pairs) / per_step:.1f} "
          f"µs, parascale {statistics.median(q[0] for _, q in pairs) / per_step:.1f} µs")
    print(f"median ratio parascale / plain (CPU time): {statistics.median(cpu_ratio):.3f} "
          f"(min {min(cpu_ratio):.3f}, max {max(cpu_ratio):.3f})")
    print(f"median ratio parascale / plain (wall time): {statistics.median(wall_ratio):.3f} "
          f"(min {min(wall_ratio):.3f}, max {max(wall_ratio):.3f}); load average "
          f"{os.getloadavg()[0]:.1f}; torch {torch.__version__}, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
