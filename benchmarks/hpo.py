"""Inter-model against data parallelism in a search (seed 004): on 2 cores, is a search faster
with two trials at once, each on one core (``--devices-per-trial 1``), or one trial at a time,
data-parallel on both (``--devices-per-trial 2``)?

Both run the same search (the same trials: --trials values of the learning rate, chosen
from a list, so every trial costs the same) with ``parascale hpo``, in alternating rounds; the
table shows each round's wall time of the whole command, the trials per minute, and the ratio.

    .venv/bin/python benchmarks/hpo.py [--rounds 3] [--trials 4] [--epochs 3] [--model resnet20]
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def search(out: str, per_trial: int, args) -> float:
    """Wall time of one whole ``parascale hpo`` command."""
    rates = ",".join(f"{0.02 + 0.01 * i:g}" for i in range(args.trials))
    command = [sys.executable, "-m", "parascale", "hpo", "--model", args.model, "--dataset",
               "digits", "--epochs", str(args.epochs), "--trials", str(args.trials),
               "--param", f"lr={rates}", "--pruner", "none",
               "--devices-per-trial", str(per_trial), "--out", out]
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--model", default="resnet20")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        sys.exit("needs 2 cores")
    print(f"# {platform.node()}, {cores} cores; {args.trials} trials of {args.model} on digits, "
          f"{args.epochs} epochs each; {args.rounds} alternating rounds")
    print("| round | 2 trials at once, 1 core each (s) | 1 trial at a time, 2 cores (s) | "
          "ratio |")
    print("|---|---|---|---|")
    times: dict[int, list[float]] = {1: [], 2: []}
    for k in range(1, args.rounds + 1):
        for per_trial in (1, 2) if k % 2 else (2, 1):  # ABBA: drift hits both alike
            folder = tempfile.mkdtemp(prefix="parascale-bench-hpo-")
            try:
                times[per_trial].append(search(f"{folder}/s", per_trial, args))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        print(f"| {k} | {times[1][-1]:.1f} | {times[2][-1]:.1f} | "
              f"{times[2][-1] / times[1][-1]:.2f} |", flush=True)
    a, b = statistics.median(times[1]), statistics.median(times[2])
    print(f"\nmedian: two at once {a:.1f} s ({60 * args.trials / a:.1f} trials/min), one at a "
          f"time data-parallel {b:.1f} s ({60 * args.trials / b:.1f} trials/min); one at a time "
          f"takes {b / a:.2f}x as long")
    return 0


if __name__ == "__main__":
    sys.exit(main())
