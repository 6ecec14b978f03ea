"""The step's own cost before and after a change: ``step_overhead.py`` of two source trees (two
git worktrees), run in alternation (A B, B A, ...), each run its own process with its tree's
``src`` first on the path, so drifting load hits both alike.

    .venv/bin/python benchmarks/step_overhead_ab.py --before /work/wt/before --after . \
        [--runs 6] [--rounds 11] [--steps 300]

Each run prints its median per-step CPU time of the plain step and parascale's, and the median
ratio parascale / plain by CPU time (the figure that waiting for a core does not move); this
prints every run and, per tree, the mean over its runs of each, with the load average before
and after.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

PER_STEP = re.compile(r"CPU time per step: plain ([\d.]+) µs, parascale ([\d.]+) µs")
RATIO = re.compile(r"median ratio parascale / plain \(CPU time\): ([\d.]+)")


def one(tree: Path, rounds: int, steps: int) -> tuple[float, float, float]:
    """(plain µs, parascale µs, ratio) of one run of ``tree``'s benchmark."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run([sys.executable, str(tree / "benchmarks" / "step_overhead.py"),
                           "--rounds", str(rounds), "--steps", str(steps)], env=env, cwd=tree,
                          capture_output=True, text=True, check=True)
    per_step, ratio = PER_STEP.search(done.stdout), RATIO.search(done.stdout)
    if per_step is None or ratio is None:
        raise SystemExit(f"{tree}: no figures in its output:\n{done.stdout}{done.stderr}")
    return float(per_step[1]), float(per_step[2]), float(ratio[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path("."))
    parser.add_argument("--runs", type=int, default=6, help="runs of each tree")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    print(f"# {os.cpu_count()} cores; load average before {os.getloadavg()[0]:.2f}; "
          f"before = {trees['before']}, after = {trees['after']}", flush=True)
    got: dict[str, list[tuple[float, float, float]]] = {"before": [], "after": []}
    for r in range(args.runs):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            figures = one(trees[name], args.rounds, args.steps)
            got[name].append(figures)
            print(f"run {r + 1} {name:6}: plain {figures[0]:.1f} µs, parascale {figures[1]:.1f} "
                  f"µs, ratio {figures[2]:.3f}", flush=True)
    for name, runs in got.items():
        print(f"{name:6} mean of {len(runs)} runs: plain {statistics.mean(f[0] for f in runs):.1f} "
              f"µs, parascale {statistics.mean(f[1] for f in runs):.1f} µs per step, ratio "
              f"parascale / plain {statistics.mean(f[2] for f in runs):.3f}")
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
