"""How long does the command line take to answer? Each command started as a user starts it.

Prints, with the load average before and after (a figure taken under load is no figure):

- the wall time of the real ``parascale`` command (the console script beside this Python, else
  ``python -m parascale``) for ``--version``, every command's ``--help`` and usage errors that
  need no tensor (an unknown model, a bad --lr, ...): ``--rounds`` rounds, each running every
  command once in turn (so that drift hits all alike), median and range;
- ``python -c "import torch"`` in the same rounds, the cost these answers no longer pay;
- unless ``--pairs 0``, benchmarks/startup.py's comparison: ``torchrun`` on a minimal DDP script
  against ``parascale train --workers 2 --steps 1``, alternating, and their ratio.

    .venv/bin/python benchmarks/cli_latency.py [--rounds 5] [--pairs 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup import commands, spread  # benchmarks/startup.py: the one-step run against torchrun

PY = sys.executable
TORCH_IMPORT = 'python -c "import torch"'

#: (what is timed, its arguments, the exit code it must end with)
COMMANDS = [
    ("--version", ["--version"], 0),
    ("--help", ["--help"], 0),
    *((f"{name} --help", [*name.split(), "--help"], 0)
      for name in ("train", "run", "bench", "demo", "report", "comm", "find-batch", "hpo",
                   "predict", "slurm", "slurm train", "slurm bench", "slurm run", "slurm status")),
    ("train --model nosuch", ["train", "--model", "nosuch"], 2),
    ("train --lr -1", ["train", "--lr", "-1"], 2),
    ("train --lr abc", ["train", "--lr", "abc"], 2),
    ("train --epochs 2 --steps 1", ["train", "--epochs", "2", "--steps", "1"], 2),
    ("train --out /proc/x", ["train", "--out", "/proc/x"], 2),
    ("bench --model nosuch", ["bench", "--model", "nosuch", "--dry-run"], 2),
    ("hpo --param lrr=0.1:0.2", ["hpo", "--out", "hpo", "--param", "lrr=0.1:0.2"], 2),
    ("run no_such_script.py", ["run", "no_such_script.py"], 2),
]


def program() -> list[str]:
    """The command a user types: the console script of this environment, else -m."""
    script = Path(PY).with_name("parascale")
    return [str(script)] if script.is_file() else [PY, "-m", "parascale"]


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) \
        if Path("/proc/loadavg").is_file() else "unknown"


def timed(argv: list[str], code: int, folder: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - start
    if done.returncode != code:
        sys.exit(f"{' '.join(argv)} ended with {done.returncode}, not {code}: "
                 f"{done.stderr.decode(errors='replace').strip()[-500:]}")
    return took


def answers(rounds: int) -> None:
    base = program()
    times: dict[str, list[float]] = {label: [] for label, _, _ in COMMANDS}
    torch_import: list[float] = []
    with tempfile.TemporaryDirectory() as folder:  # nothing is written; if it were, here
        for _ in range(rounds):
            for label, args, code in COMMANDS:
                times[label].append(timed([*base, *args], code, folder))
            torch_import.append(timed([PY, "-c", "import torch"], 0, folder))
    width = max(map(len, times)) + len("parascale ")
    for label, values in times.items():
        print(f"{'parascale ' + label:<{width}}  {spread(values)}")
    print(f"{TORCH_IMPORT:<{width}}  {spread(torch_import)}")
    slowest = max(times, key=lambda label: statistics.median(times[label]))
    print(f"slowest median: parascale {slowest}, {statistics.median(times[slowest]):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=5,
                        help="alternating torchrun/parascale pairs of the one-step run (0: none)")
    args = parser.parse_args()
    print(f"# {os.cpu_count()} cores; {' '.join(sys.argv)}; {' '.join(program())}")
    print(f"# load average before: {load()}")
    answers(args.rounds)
    print(f"# load average: {load()}")
    if args.pairs:
        commands(args.pairs)
        print(f"# load average after: {load()}")


if __name__ == "__main__":
    main()
