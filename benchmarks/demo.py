"""What `make demo` costs and shows on this machine: the figures the README quotes.

Runs `parascale demo` (and optionally `--quick`) from scratch into a fresh folder, as a new user
would, and prints the command's wall time, the machine, how busy the machine was before and
during the runs, and the demo's own verdict sentences (ratio at every N with its interval, the
lost-efficiency split, the sync cost), read back from the records with parascale's report code.
With --rounds K the full demo runs K times, each into a fresh folder, alternating with --quick
when that is asked for, so that drift hits both alike.

    .venv/bin/python benchmarks/demo.py [--rounds 1] [--quick]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from parascale.report import load_studies, summary_rows
from parascale.report.wording import sentences
from parascale.runtime import machine


def run_demo(folder: Path, quick: bool) -> float:
    """Wall time of one `parascale demo` into ``folder`` (which must not exist yet)."""
    command = [sys.executable, "-m", "parascale", "demo", "--out", str(folder)]
    if quick:
        command.append("--quick")
    began = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.monotonic() - began
    if proc.returncode != 0:
        sys.exit(f"demo failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                 f"{proc.stderr[-3000:]}")
    return wall


def summary(folder: Path) -> tuple[list[str], int, int]:
    """The demo's verdict sentences, its run count and how many runs saw a busy machine."""
    loaded = load_studies([folder])
    rows = summary_rows(loaded.records)
    busy = sum(1 for r in loaded.records if r.get("machine", "busy") is True)
    return sentences(rows, loaded.unfinished), len(loaded.records), busy


def describe_machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{machine.cores()} CPUs ({model}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="full demos to run (default 1)")
    parser.add_argument("--quick", action="store_true", help="also time `demo --quick`, "
                        "alternating with the full demo")
    args = parser.parse_args()
    import torch

    print(f"machine: {describe_machine()}; torch {torch.__version__}")
    before = machine.sample_other_cores(2.0)
    print(f"load before the first round (other programs, 2 s sample): "
          f"{before['other_cores'] + before['steal_cores']:.2f} cores of {machine.cores()}")
    walls: dict[str, list[float]] = {"full": [], "quick": []}
    last: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="parascale-bench-demo-") as tmp:
        for k in range(1, args.rounds + 1):
            kinds = ["full", "quick"] if args.quick else ["full"]
            if k % 2 == 0:
                kinds.reverse()  # A B, B A, ...
            for kind in kinds:
                folder = Path(tmp) / f"{kind}-{k}"
                wall = run_demo(folder, quick=kind == "quick")
                walls[kind].append(wall)
                _, runs, busy = summary(folder)
                print(f"round {k}: parascale demo{' --quick' if kind == 'quick' else ''}: "
                      f"{wall:.0f} s wall, {runs} runs, {busy} on a busy machine", flush=True)
                last[kind] = folder
        for kind, values in walls.items():
            if values:
                print(f"\n{kind} demo wall time: median {statistics.median(values):.0f} s "
                      f"(min {min(values):.0f}, max {max(values):.0f}, n = {len(values)})")
        for kind, folder in last.items():
            said, _, _ = summary(folder)
            print(f"\nwhat the last {kind} demo concluded:")
            for sentence in said:
                print(f"- {sentence}")
    print(f"\nmeasured {time.strftime('%Y-%m-%d %H:%M')} on {os.uname().nodename}")


if __name__ == "__main__":
    main()
