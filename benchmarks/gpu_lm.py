"""The GPT on one GPU: ``parascale train`` against a plain training loop of the same model.

Same model class (parascale's ``gpt``), same data (the shakespeare corpus: the same windows in
the same shuffled order), same batch, AdamW (0.9, 0.95, weight decay 0.1 on the matrices and
embeddings), bf16 autocast, at two shapes: 6 layers x 6 heads x 384 wide with context 256 and
batch 64, and GPT-2 small's 12 x 12 x 768 with context 1024 and batch 16, each eager and with
``torch.compile``. The plain loop is what a single-file GPT script does on a GPU: pinned batches
copied without blocking, the fused AdamW kernel, forward under autocast, cross-entropy, backward,
step, and nothing else. Both run in fresh processes, alternating (plain, parascale; then
parascale, plain...), so drifting conditions hit both alike.

Each reports its steady time per step over the steps after the first tenth: the plain loop by
the wall clock between two synchronisations, parascale by its record (its steady steps' mean
step time, from CUDA events). Both MFUs use the same count (torch's FLOP counter, from
parascale's record) and peak (the GPU's datasheet figure). The ratio is plain / parascale time
per step (above 1: parascale is faster). ``--device cpu --tiny`` runs a tiny model on the CPU
for a few steps: what the test suite checks.

    .venv/bin/python benchmarks/gpu_lm.py [--rounds 2] [--steps 100] [--modes eager,compiled]
    .venv/bin/python benchmarks/gpu_lm.py --device cpu --tiny --steps 6
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (layers, heads, width, context, batch)
SHAPES = {"6x6x384": (6, 6, 384, 256, 64), "gpt2-small": (12, 12, 768, 1024, 16)}
TINY = {"tiny": (2, 2, 32, 16, 4)}
SEED, LR, BETA2, DECAY = 0, 6e-4, 0.95, 0.1


def plain(shape: tuple[int, ...], steps: int, device: str, compiled: bool) -> float:
    """The plain loop, in this process: seconds per step over the steps after the first tenth."""
    import torch
    import torch.nn.functional as F

    from parascale import models
    from parascale.data import text
    from parascale.training.loop.sampling import epoch_order

    layers, heads, width, context, batch = shape
    torch.set_num_threads(1)
    ids, vocab = text.encode(text.corpus())
    stream = ids[:int(len(ids) * text.TRAIN_FRACTION)]
    order = epoch_order((len(stream) - 1) // context, seed=SEED, epoch=1)  # parascale's order
    offsets = torch.arange(context + 1)
    cuda = device == "cuda"
    torch.manual_seed(SEED)
    model = models.build("gpt", len(vocab), (context,), gpt_layers=layers, gpt_heads=heads,
                         gpt_width=width).to(device)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=(0.9, BETA2), weight_decay=DECAY,
                                  **({"fused": True} if cuda else {}))
    net = torch.compile(model) if compiled else model
    autocast = torch.autocast(device, dtype=torch.bfloat16)

    def batch_at(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = stream[order[step * batch:(step + 1) * batch, None] * context + offsets]
        if cuda:
            window = window.pin_memory().to(device, non_blocking=True)
        window = window.long()
        return window[:, :-1], window[:, 1:]

    skip = max(1, steps // 10)
    for step in range(steps):
        if step == skip:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
        x, y = batch_at(step)
        with autocast:
            loss = F.cross_entropy(net(x).flatten(0, -2).float(), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / (steps - skip)


def run_plain(shape: tuple[int, ...], steps: int, device: str, compiled: bool) -> float:
    command = [sys.executable, __file__, "--plain", ",".join(map(str, shape)), "--steps",
               str(steps), "--device", device] + (["--compiled"] if compiled else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def run_parascale(shape: tuple[int, ...], steps: int, device: str,
                  compiled: bool) -> tuple[float, dict]:
    """``parascale train`` of the same job: seconds per steady step, and the record's flops."""
    layers, heads, width, context, batch = shape
    where = ["--gpus", "0"] if device == "cuda" else ["--device", "cpu", "--workers", "1"]
    with tempfile.TemporaryDirectory() as out:
        # a one-window validation split and no test set: evaluation is not what is compared
        subprocess.run([sys.executable, "-m", "parascale", "train", "--model", "gpt",
                        "--dataset", "shakespeare", *where, "--threads", "1",
                        "--context", str(context), "--gpt-layers", str(layers),
                        "--gpt-heads", str(heads), "--gpt-width", str(width),
                        "--batch-size", str(batch), "--steps", str(steps), "--seed", str(SEED),
                        "--precision", "bf16", "--optimizer", "adamw", "--lr", str(LR),
                        "--adam-beta2", str(BETA2), "--weight-decay", str(DECAY),
                        "--no-evaluate-test", "--val-fraction", "0.00001", "--eval-batches", "1",
                        "--no-save-model", "--out", out, *(["--compile"] if compiled else [])],
                       check=True, stdout=subprocess.DEVNULL)
        record = json.loads(Path(out, "record.json").read_text())
    return batch / record["summary"]["steady_throughput"], record["flops"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model, for a test on a CPU")
    parser.add_argument("--modes", default=None, help="eager,compiled (default; --tiny: eager)")
    parser.add_argument("--plain", help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain:
        shape = tuple(int(v) for v in args.plain.split(","))
        print(plain(shape, args.steps, args.device, args.compiled))
        return
    modes = (args.modes or ("eager" if args.tiny else "eager,compiled")).split(",")
    rows = []
    for name, shape in (TINY if args.tiny else SHAPES).items():
        for mode in modes:
            compiled = mode == "compiled"
            pairs = []
            for r in range(args.rounds):  # A B, B A, ...: drifting conditions hit both alike
                first_plain = r % 2 == 0
                if first_plain:
                    theirs = run_plain(shape, args.steps, args.device, compiled)
                ours, flops = run_parascale(shape, args.steps, args.device, compiled)
                if not first_plain:
                    theirs = run_plain(shape, args.steps, args.device, compiled)
                pairs.append((theirs, ours))
                print(f"{name} {mode} round {r + 1}: plain {theirs * 1e3:.2f} ms/step, "
                      f"parascale {ours * 1e3:.2f} ms/step, ratio {theirs / ours:.3f}",
                      flush=True)
            rows.append(_row(name, shape, mode, pairs, flops))
    _table(rows, args)


def _row(name: str, shape: tuple[int, ...], mode: str, pairs: list[tuple[float, float]],
         flops: dict) -> list[str]:
    tokens = shape[3] * shape[4]
    theirs = statistics.median(p[0] for p in pairs)
    ours = statistics.median(p[1] for p in pairs)
    per_step, peak = flops.get("flops_per_step"), flops.get("peak_flops")

    def mfu(seconds: float) -> str:
        return f"{per_step / seconds / peak:.1%}" if per_step and peak else "-"

    ratio = statistics.median(p[0] / p[1] for p in pairs)
    layers, heads, width, context, batch = shape
    return [f"{name} ({layers}x{heads}x{width}, T {context}, B {batch})", mode,
            f"{theirs * 1e3:.2f}", f"{ours * 1e3:.2f}", f"{tokens / theirs:,.0f}",
            f"{tokens / ours:,.0f}", mfu(theirs), mfu(ours), f"{ratio:.3f}"]


def _table(rows: list[list[str]], args: argparse.Namespace) -> None:
    import torch

    head = ["shape", "mode", "plain ms/step", "parascale ms/step", "plain tok/s",
            "parascale tok/s", "plain MFU", "parascale MFU", "ratio"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print()
    for row in [head, *rows]:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (1 thread)"
    print(f"\n{device}; torch {torch.__version__}; bf16 autocast, AdamW; {args.steps} steps per "
          f"run, steady over the last nine tenths; median of {args.rounds} alternating rounds; "
          "ratio = plain / parascale time per step (above 1: parascale is faster)")


if __name__ == "__main__":
    main()
