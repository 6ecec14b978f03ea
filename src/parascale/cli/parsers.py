"""The parsers of ``train``, ``bench`` and ``run``, which ``slurm train``, ``slurm bench`` and
``slurm run`` build too (the same options, checked by the same code; ``run``'s script and its
arguments read by the same code), and ``--quiet-machine``, which ``demo`` shares. Each command
module sets its own ``func``; no command imports another."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from parascale import sync
from parascale.checks import path_option
from parascale.cli.options import add_train_options, flag, sync_help
from parascale.digits import INT_RE, ascii_float, ascii_int
from parascale.errors import UsageError

TRAIN_DESCRIPTION = """\
Train a model with synchronous data parallelism on N CPU worker processes (--workers, default
one per core), on GPUs (--gpus 0,1,2,3), or as one rank of a world started by torchrun or srun.
Give the per-device batch (--batch-size) or the global batch (--global-batch), not both: the
other is derived and printed at start, with the effective learning rate.

Writes DIR/record.json (the run record: configuration, environment, per-epoch and per-step
measurements; see docs/record.md), DIR/model.pt (the final state_dict) and DIR/log.txt (what
the run printed), nothing else; with --checkpoint-every also DIR/checkpoints/, from which
--resume continues and --max-restarts restarts (docs/checkpoints.md).
"""

TRAIN_EXAMPLES = """\
examples:
  parascale train --workers 2 --model smallcnn --dataset digits --epochs 5
  parascale train --gpus 0,1,2,3 --model resnet50 --dataset cifar10 --data-dir data \\
      --image-size 128 --global-batch 1024 --lr 0.1 --lr-scaling linear --base-batch 256
  torchrun --nnodes 2 --nproc-per-node 4 ... -m parascale train --model resnet20 ...
"""


def train_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``train``'s parser and options (its ``func`` is the caller's to set)."""
    parser = subparsers.add_parser(
        "train", help="train one model with data parallelism and write its run record",
        description=TRAIN_DESCRIPTION, epilog=TRAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_options(parser)
    return parser


BENCH_DESCRIPTION = """\
Run a scaling study: every configuration of a plan is one training run (as 'parascale train'),
one after another, each recorded in STUDY/runs/<configuration>/record.json; at the end a summary
table (speedup, efficiency, sync cost, time-to-accuracy) and an HTML report in STUDY/report/.

The plan is the Cartesian product of the variables (-V name=v1,v2) over the fixed parameters
(-P name=value, every train option below, or a --config YAML/TOML file with parameters,
variables and extensions). A value may refer to another, "${model}", or be computed,
'$(${global_batch} // ${workers})$'; a name that is neither a train option nor used by another
value is an error, as are reference cycles: all before anything runs.

Scaling modes: --scaling weak keeps the per-device batch (--batch-size b; effective batch N*b,
efficiency t1/tN); --scaling strong keeps the effective batch (--global-batch B; per-device B/N,
efficiency t1/(N*tN); an N that does not divide B is skipped with that reason). Efficiency is
never capped. The learning-rate rule (--lr-scaling) applies per configuration.

Without --scaling, --workers or -V (no study at all, only training options), bench runs a weak
scaling study over 1, 2, 4, ... and all cores (strong when --global-batch is given): one
configuration cannot say how anything scaled. --workers N runs that one configuration, and its
summary shows no speedup.

Re-running the same command resumes: runs already recorded are kept (--rerun never), so an
interrupted study continues where it stopped; adding worker counts or repeats grows it. A study
folder holds one plan (plan.json): running a different plan in it says so, and the earlier
plan's runs are kept apart (left out of the tables, listed as not in the plan). An
out-of-memory run is recorded as such, and the larger per-device batches of that configuration
are skipped, each with the reason.
"""

BENCH_EXAMPLES = """\
examples:
  # weak scaling of a small CNN over 1, 2, 4 workers, 3 runs each (medians, spread)
  parascale bench --model smallcnn --dataset digits --scaling weak --workers 1,2,4 \\
      --batch-size 32 --epochs 3 --repeat 3 --baseline --out studies/cnn-weak

  # strong scaling, effective batch 1024 on 1, 2, 4, 8 GPUs (DLBS's AlexNet example)
  parascale bench --model resnet50 --dataset cifar10 --data-dir data --gpus 0,1,2,3,4,5,6,7 \\
      --scaling strong --global-batch 1024 --workers pow2 --steps 200 --out studies/r50-strong

  # the same, DLBS style: the per-device batch computed from a helper parameter
  parascale bench --model resnet50 --dataset cifar10 --data-dir data --gpus 0,1,2,3,4,5,6,7 \\
      -V workers=1,2,4,8 -P effective=1024 -P 'batch_size=$(${effective} // ${workers})$' \\
      --steps 200 --out studies/r50-dlbs

  # sweep the per-device batch; see the plan first
  parascale bench --scaling weak --workers all -V batch_size=32,64,128,256 --dry-run

  # a study file (YAML or TOML: parameters, variables, extensions) plus command-line overrides
  parascale bench --config study.yaml -P epochs=5 --out studies/mine

  # your own training script on 1, 2 and 4 workers, with the contention baseline
  parascale bench --script train.py --script-args='--epochs 3' --workers 1,2,4 --baseline

worker lists (--workers): 1,2,4 | 1-4 | pow2 (1, 2, 4, ... up to all devices) | pow2:8 | all
With --gpus G1,...,Gk, a run with N workers uses the first N GPUs of the list.
"""


DEFAULT_QUIET_S = 120.0  # --quiet-machine without a value


def add_quiet_option(group: Any) -> None:
    group.add_argument("--quiet-machine", type=ascii_float, nargs="?", const=DEFAULT_QUIET_S,
                       default=None, metavar="MAX_S",
                       help="before each run, wait until other programs use less than a tenth "
                       f"of the cores, at most MAX_S seconds (default {DEFAULT_QUIET_S:.0f}); "
                       "what was seen is recorded in each run's study block")


def bench_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``bench``'s parser and options (its ``func`` is the caller's to set)."""
    parser = subparsers.add_parser(
        "bench", help="run a scaling study (weak/strong, worker counts, parameter sweeps)",
        description=BENCH_DESCRIPTION, epilog=BENCH_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    study = parser.add_argument_group("study")
    study.add_argument("--config", metavar="FILE",
                       help="study file (.yaml, .yml or .toml) with parameters, variables and "
                       "extensions; the command line overrides it")
    study.add_argument("-P", "--param", action="append", default=[], metavar="NAME=VALUE",
                       help="a fixed parameter, e.g. -P lr=0.1 or -P 'batch_size=${b}' "
                       "(repeatable)")
    study.add_argument("-V", "--var", action="append", default=[], metavar="NAME=V1,V2,...",
                       help="a variable: one configuration per value, e.g. -V lr=0.05,0.1 "
                       "(repeatable; the plan is the product of all variables)")
    study.add_argument("--scaling", choices=("weak", "strong"),
                       help="weak: per-device batch fixed (--batch-size); strong: effective "
                       "batch fixed (--global-batch)")
    study.add_argument("--workers", dest="workers_spec", metavar="SPEC",
                       help="worker counts: 1,2,4 | 1-4 | pow2 | pow2:N | all (default with "
                       "--scaling: powers of two up to all cores or GPUs, and all)")
    study.add_argument("--repeat", type=ascii_int, default=1, metavar="K",
                       help="run each configuration K times, in rounds (every configuration "
                       "once, then again: ABAB..., so that drift hits all alike); the summary "
                       "shows medians and the spread (default: 1)")
    add_quiet_option(study)
    study.add_argument("--rerun", choices=("never", "failed", "always"), default="never",
                       help="which recorded runs to run again: never (resume; default), "
                       "failed, always")
    study.add_argument("--baseline", action="store_true",
                       help="also run each N>1 configuration without synchronisation (same "
                       "processes, gradients never exchanged): the gap is the sync cost")
    study.add_argument("--dry-run", action="store_true",
                       help="print the plan (every configuration, or why it is skipped) and "
                       "exit without running or writing anything")
    study.add_argument("--out", dest="study_out", metavar="STUDY", type=path_option("--out"),
                       help="study folder (default: studies/<model>-<dataset>-<scaling>)")
    study.add_argument("--script", metavar="FILE",
                       help="study your own training script: each run is 'parascale run FILE' "
                       "(docs/scripts.md); only parascale run's options then apply, the rest "
                       "is the script's (-P/-V script_args=... or --script-args)")
    study.add_argument("--script-args", metavar="ARGS",
                       help="the script's arguments, as one string split as a shell would "
                       "(--script-args='--epochs 2'); the study's value script_args")
    add_train_options(parser, exclude={"workers", "out"})
    for action in parser._actions:
        if action.dest == "batch_size":  # bench also takes 'max': the batch search decides
            action.type, action.metavar = _batch_or_max, "B|max"
            action.help += (" 'max': the largest per-device batch that fits, found first by "
                            "the batch search (parascale find-batch; on the CPU within half the "
                            "free memory shared by one worker per core)")
        if action.dest == "save_model":  # bench keeps records only, unless asked
            action.help = "Also keep each run's final model (runs/<configuration>/model.pt). " \
                "(default in bench: no)"
    return parser


def _batch_or_max(text: str) -> int | str:
    if text.strip() == "max":
        return "max"
    if not INT_RE.fullmatch(text.strip()):  # int() also reads '５' and '1_0'
        raise argparse.ArgumentTypeError(f"expected a batch size in ASCII digits or max, "
                                         f"got {text!r}")
    return int(text)


RUN_DESCRIPTION = """\
Start N copies of your own training script (--workers N, default one per core; or --gpus
0,1,...), each a rank of one data-parallel job, or join the world of torchrun or srun. The
script calls parascale's small API (import parascale.script; docs/scripts.md): its steps are
measured on every rank and rank 0 writes DIR/record.json, the same run record as 'parascale
train', which 'report' and 'predict' read, with DIR/model.pt and DIR/log.txt. Everything
after the script's path is the script's: parascale's own options go before it (write -- after
the script when it takes an option of the same name).
"""

RUN_EXAMPLES = """\
examples:
  parascale run --workers 2 examples/digits_parascale.py --batch-size 16
  parascale run --workers 4 --sync local-sgd --period 8 --out runs/mine train.py --epochs 3
  torchrun --nproc-per-node 2 -m parascale run --out runs/tr train.py
"""


def run_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``run``'s parser and options (its ``func`` is the caller's to set)."""
    from parascale.script.options import taken  # here: parascale.script imports torch

    parser = subparsers.add_parser(
        "run", help="launch your own training script on N workers and record how it scaled",
        description=RUN_DESCRIPTION, epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from parascale.config import NAMES

    add_train_options(parser, exclude=(set(NAMES) | set(sync.options())) - set(taken()))
    for action in parser._actions:
        if action.dest == "sync":  # the trainer's list names strategies a script cannot run
            action.help = sync_help(sync.with_trait(script_refusal=None)) + \
                " The others need parascale's own training step."
    # one REMAINDER for the script and its arguments: argparse keeps a '--' inside it (it drops
    # the one that follows a positional of its own, which script_args must see)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="script.py ...",
                        help="the training script to run, then its own arguments")
    return parser


def script_args(script: Path, args: list[str]) -> list[str]:
    """The script's arguments; one that is an option of ``run`` itself is refused, since the
    user more likely meant it for parascale (``--`` first passes everything as it is)."""
    from parascale.script.options import taken

    if args[:1] == ["--"]:
        return args[1:]
    ours = {flag(name) for name in taken() if name != "sync_options"} | \
        {"--sync-option", "--no-oversubscribe"}
    for arg in args:
        name = arg.partition("=")[0]
        if name in ours:
            raise UsageError(f"{name} comes after {script.name}, so it would go to the script, "
                             f"not to parascale: give parascale's options before the script, "
                             f"or write -- after {script.name} to pass {name} to the script")
    return args


def script_and_args(command: list[str]) -> tuple[Path, list[str]]:
    """The script and its arguments from what follows run's own options (``slurm run`` too)."""
    from parascale.script.launch import checked_script

    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("give the script to run: parascale run [options] script.py [its "
                         "arguments]")
    script = checked_script(command[0])
    return script, script_args(script, command[1:])
