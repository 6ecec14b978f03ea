"""``parascale demo``: a built-in scaling study of this machine, no arguments needed.

Weak and strong scaling of a small ResNet on the bundled digits data over 1, 2, 4, ... and all CPU
cores, with a contention baseline (same processes, no gradient exchange) for every N > 1 and a
target accuracy, so that the summary shows speedup, efficiency, sync cost and time-to-accuracy.
It is an ordinary bench study (``studies/demo``; ``--quick`` has its own, ``studies/demo-quick``,
so the two never mix): a second ``parascale demo`` re-uses the runs already recorded. The weak and
strong studies run as one plan, in rounds across both (every configuration once, then again), so
that drift on a shared machine hits them alike.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from parascale.checks import path_option

# Chosen by measurement on 2 cores. At 8x8 a small CNN's epoch lasts ~0.1 s, too short to time
# honestly. smallcnn at 28x28 carries a 1.6M-parameter dense layer (6.4 MB of gradients a step)
# and lenet computes too little per byte sent, so on 2 CPU workers both run slower than on one:
# a true result, but a poor first picture. resnet20 at 16x16 (0.27M parameters, conv-heavy) does
# enough work per byte communicated to show data parallelism paying off, with one worker taking
# about 2.5 s per epoch at batch 24. 4 epochs leave 3 steady epochs after the warm-up, and every
# configuration reaches the 90% target by its third. The weak and strong batches never give the
# same configuration twice (24·N against 64); no learning-rate scaling, because the contention
# baseline's independent replicas diverged with the linearly scaled rate. Nearly all of the
# demo's time is training (0.1-0.2 s between configurations): 5 epochs at per-device batch 16
# took 146 s where this took 99 s, one after the other (benchmarks/RESULTS-demo.md: 102-122 s).
FULL: dict[str, Any] = {"model": "resnet20", "dataset": "digits", "image_size": 16,
                        "epochs": 4, "target_accuracy": 0.9, "lr": 0.05}
QUICK: dict[str, Any] = {"model": "smallcnn", "dataset": "digits", "epochs": 2,
                         "target_accuracy": 0.8, "lr": 0.05}
REPEAT = 2  # every configuration twice: the tables show medians and their spread
MAX_WORKERS = 16  # beyond, weak scaling's global batch approaches the training set's size
WEAK_BATCH = 24  # per device (global 24·N)
STRONG_BATCH = 64  # global (per device 64/N)

DESCRIPTION = """\
Run a built-in scaling study on this machine: weak scaling (per-device batch 24) and strong
scaling (global batch 64) of a CIFAR-style ResNet-20 on the bundled digits, resized to 16x16,
over 1, 2, 4, ... and all CPU cores (at most 16), each N > 1 also without synchronisation
(the contention baseline: same processes, gradients never exchanged), 4 epochs with a 90%
accuracy target, every configuration twice (medians, with the spread). It took 63 and 67 s on
2 quiet vCPUs (benchmarks/demo.py, benchmarks/RESULTS-demo.md); longer while other programs use
the cores. Ends with the summary table (speedup, efficiency, sync cost, time-to-accuracy) and
the path of the HTML report.

The demo is an ordinary 'parascale bench' study folder (studies/demo, or studies/demo-quick for
--quick): running it again re-uses the recorded runs (--rerun always measures again).
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from parascale.cli.parsers import add_quiet_option

    parser = subparsers.add_parser(
        "demo", help="run a built-in weak and strong scaling study on this machine (about 1 "
        "min on 2 quiet cores)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, metavar="STUDY", type=path_option("--out"),
                        help="study folder (default: studies/demo, or studies/demo-quick with "
                        "--quick: the two plans differ and must not share a folder)")
    parser.add_argument("--rerun", choices=("never", "failed", "always"), default="never",
                        help="which recorded runs to run again (default: never, i.e. re-use)")
    parser.add_argument("--quick", action="store_true",
                        help="a much smaller version (8x8 digits, 2 epochs, no baselines): 7 s "
                        "on 2 quiet vCPUs")
    parser.add_argument("--tensorboard", metavar="DIR", type=path_option("--tensorboard"),
                        help="also write each run's figures as TensorBoard event files, into "
                        "DIR/<configuration> (see 'parascale train --help')")
    add_quiet_option(parser)
    parser.set_defaults(func=run)
    return parser


def default_folder(quick: bool) -> Path:
    """studies/demo, and studies/demo-quick for --quick: two plans never share a folder."""
    return Path("studies/demo-quick" if quick else "studies/demo")


def demo_workers() -> str:
    """1, 2, 4, ... and every core, at most MAX_WORKERS (digits has only 1,437 training samples)."""
    from parascale.runtime.env import available_cores

    top = min(available_cores(), MAX_WORKERS)
    counts = sorted({2 ** k for k in range(top.bit_length())} | {top})
    return ",".join(map(str, counts))


def demo_jobs(quick: bool = False, tensorboard: str | None = None) -> list:
    """The demo's jobs: the weak and the strong study in one plan, in rounds across both."""
    from parascale.bench.study import combine, interleave, make_jobs, with_tensorboard

    fixed = QUICK if quick else FULL
    workers = demo_workers()
    repeat = 1 if quick else REPEAT
    weak = combine(options={**fixed, "batch_size": WEAK_BATCH},
                   scaling="weak", workers=workers, baseline=not quick, repeat=repeat)
    strong = combine(options={**fixed, "global_batch": STRONG_BATCH},
                     scaling="strong", workers=workers, baseline=not quick, repeat=repeat)
    return with_tensorboard(interleave(make_jobs(weak), make_jobs(strong)), tensorboard)


def run(args: argparse.Namespace) -> int:
    from parascale.run_summary import process_start

    command_start = process_start()  # the interpreter's and torch's start-up count too
    from parascale.bench.session import check_quiet, echo, execute, typed_command
    from parascale.files import check_writable_folder
    from parascale.runtime.env import available_cores

    check_quiet(args.quiet_machine)
    study = Path(args.out) if args.out else default_folder(args.quick)
    check_writable_folder(study)  # before planning, which builds the data (torch)
    jobs = demo_jobs(args.quick, args.tensorboard)
    workers = sorted({job.world_size for job in jobs})
    fixed = QUICK if args.quick else FULL
    size = f"{fixed['image_size']}x{fixed['image_size']}" if fixed.get("image_size") else "8x8"
    echo(f"parascale demo: weak and strong scaling of {fixed['model']} on {size} digits, "
         f"{'/'.join(map(str, workers))} workers ({available_cores()} cores), "
         f"{fixed['epochs']} epochs{'' if args.quick else ', with contention baselines'}: "
         f"{len(jobs)} runs into {study}")
    began = time.time()
    code = execute(study, jobs, args.rerun, {"demo": "quick" if args.quick else "full"},
                   typed_command("demo"), args.quiet_machine)
    ended = time.time()
    echo(f"demo done in {ended - command_start:.1f} s (start-up {began - command_start:.1f} s, "
         f"runs and report {ended - began:.1f} s)")
    return code
