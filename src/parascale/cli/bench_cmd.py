"""``parascale bench``: plan a scaling study, run every configuration, summarise and report."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from parascale.batch import DEFAULT_BATCH
from parascale.cli.options import add_train_options, config_from_args
from parascale.errors import UsageError

DESCRIPTION = """\
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
plan's runs are kept apart (left out of the tables, listed as not in the plan). An out-of-memory run is recorded as such, and the
larger per-device batches of that configuration are skipped, each with the reason.
"""

EXAMPLES = """\
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

worker lists (--workers): 1,2,4 | 1-4 | pow2 (1, 2, 4, ... up to all devices) | pow2:8 | all
With --gpus G1,...,Gk, a run with N workers uses the first N GPUs of the list.
"""


DEFAULT_QUIET_S = 120.0  # --quiet-machine without a value


def add_quiet_option(group: Any) -> None:
    group.add_argument("--quiet-machine", type=float, nargs="?", const=DEFAULT_QUIET_S,
                       default=None, metavar="MAX_S",
                       help="before each run, wait until other programs use less than a tenth "
                       f"of the cores, at most MAX_S seconds (default {DEFAULT_QUIET_S:.0f}); "
                       "what was seen is recorded in each run's study block")


def check_quiet(max_s: float | None) -> float | None:
    if max_s is not None and not max_s >= 0:
        from parascale.errors import UsageError

        raise UsageError(f"--quiet-machine waits at most MAX_S seconds, which must be 0 or more, "
                         f"got {max_s:g}")
    return max_s


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="run a scaling study (weak/strong, worker counts, parameter sweeps)",
        description=DESCRIPTION, epilog=EXAMPLES,
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
    study.add_argument("--repeat", type=int, default=1, metavar="K",
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
    study.add_argument("--out", dest="study_out", metavar="STUDY",
                       help="study folder (default: studies/<model>-<dataset>-<scaling>)")
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
    parser.set_defaults(func=run)
    return parser


def _name_part(inputs: Any, name: str, default: str) -> str:
    value = inputs.variables.get(name, inputs.parameters.get(name, default))
    values = value if isinstance(value, list) else [value]
    text = "+".join(str(v) for v in values)
    if "$" in text or text.startswith("="):
        text = name
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:40] or default


def default_out(inputs: Any) -> Path:
    parts = [_name_part(inputs, "model", "smallcnn"), _name_part(inputs, "dataset", "digits"),
             _name_part(inputs, "scaling", "sweep")]
    return Path("studies") / "-".join(parts)


def echo(line: str) -> None:
    print(line, flush=True)


def summarise(study: Path) -> Path:
    """Write the report of ``study`` and STUDY/summary.txt, print the table; report.html's path."""
    from parascale.files import atomic_write_text
    from parascale.report import default_out_dir, load_studies, terminal_summary, write_loaded

    loaded = load_studies([study])  # this plan's runs only: an earlier plan's are listed apart
    path = write_loaded(loaded, default_out_dir(study))
    table = terminal_summary(loaded)
    atomic_write_text(study / "summary.txt", table + "\n")  # beside plan.json, as printed
    print()
    print(table)
    print(f"report: {path}")
    return path


def default_scaling(args: argparse.Namespace, options: dict[str, Any],
                    assignments: list[tuple[str, Any]]) -> str | None:
    """The scaling mode of the default study, when the command line names no study at all (no
    --scaling, worker counts, variables or study file): weak, or strong for a global batch."""
    named = {name for name, _ in assignments}
    if args.config or args.var or args.scaling or args.workers_spec \
            or named & {"workers", "scaling"}:
        return None
    return "strong" if "global_batch" in {*options, *named} else "weak"


def plan_from_args(args: argparse.Namespace):
    """(inputs, jobs, study folder) from the command line; UsageError for any bad input."""
    from parascale.bench import maxbatch
    from parascale.bench.plan import load_study_file, parse_assignment, parse_variable
    from parascale.bench.study import combine, make_jobs
    from parascale.runtime.world import devices_elsewhere

    options = config_from_args(args)
    assignments = [parse_assignment(text) for text in args.param]
    file = load_study_file(args.config) if args.config else None
    wants_max = maxbatch.take(file["parameters"] if file else None, options, assignments)
    args.default_scaling = default_scaling(args, options, assignments)
    scaling = args.default_scaling or args.scaling
    if scaling == "weak" and args.default_scaling and "batch_size" not in options \
            and "batch_size" not in {name for name, _ in assignments}:
        options["batch_size"] = DEFAULT_BATCH
    check_quiet(args.quiet_machine)
    inputs = combine(
        file, options, assignments,
        [parse_variable(text) for text in args.var], scaling, args.workers_spec,
        args.repeat, args.baseline)
    # a dry run plans a GPU study on any machine; a real run needs the GPUs here
    with devices_elsewhere() if args.dry_run else contextlib.nullcontext():
        jobs = make_jobs(inputs)
    if wants_max:
        maxbatch.resolve(jobs, args.dry_run, largest_batch, echo)
        inputs.parameters["batch_size"] = maxbatch.MAX  # the plan as given, in plan.json
    study = Path(args.study_out) if args.study_out else default_out(inputs)
    from parascale.files import check_writable_folder

    check_writable_folder(study)
    return inputs, jobs, study


def _batch_or_max(text: str) -> int | str:
    if text.strip() == "max":
        return "max"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a batch size or max, got {text!r}")


def largest_batch(options: dict[str, Any]) -> int:
    """--batch-size max: the batch search on the study's model and data, before planning. On
    the CPU each of up to one worker per core gets an equal share of the budget."""
    import psutil

    from parascale import data, models
    from parascale.bench.maxbatch import SEARCH_FIELDS
    from parascale.cli.find_batch_cmd import SHARE_OF_FREE, largest
    from parascale.config import TrainConfig, validate
    from parascale.runtime.env import available_cores

    fields = {k: v for k, v in options.items() if k in SEARCH_FIELDS}
    cfg = TrainConfig(**fields)
    validate(cfg)
    models.check(cfg.model)
    data.check(cfg)
    gpus = options.get("gpus")
    budget = None if gpus else \
        int(SHARE_OF_FREE * psutil.virtual_memory().available / available_cores())
    workers = len(gpus) if gpus else available_cores()
    per_worker = data.prepare(cfg)["train"] // workers  # the largest N's batches must fit the data
    found, _, _ = largest(cfg, gpus[0] if gpus else None, budget, max(1, per_worker),
                          f" (half the memory free now, over {available_cores()} workers)")
    if found.best is None:
        raise UsageError(f"batch_size max: not even a batch of 1 of {cfg.model} fits")
    return found.best.batch


def explain(args: argparse.Namespace, jobs: list) -> None:
    """Say what the plan cannot show before it runs: a default study, or no 1-worker reference."""
    from parascale.bench.study import reference_warning

    if getattr(args, "default_scaling", None):
        counts = sorted({job.world_size for job in jobs})
        echo(f"no --scaling, --workers or -V given: the plan is a {args.default_scaling} scaling "
             f"study over {', '.join(map(str, counts))} workers, so that the summary can say how "
             "it scaled (--workers N runs one configuration)")
    warning = reference_warning(jobs)
    if warning:
        echo(f"note: {warning}")


def dry_run(jobs: list, study: Path, repeat: int, rerun: str) -> None:
    from parascale.bench.runner import existing_records
    from parascale.bench.study import plan_table

    print(plan_table(jobs, repeat))
    done = existing_records(study, jobs) if study.is_dir() else {}
    kept = [r for r in done.values()
            if rerun == "never" or (rerun == "failed" and r["status"] != "failed")]
    if kept:
        print(f"{len(kept)} of {len(jobs)} runs are already recorded in {study} and would be "
              f"kept (--rerun {rerun})")
    gpus = sorted({g for job in jobs for g in job.train.get("gpus") or []})
    if gpus:
        import torch

        if torch.cuda.device_count() <= max(gpus):
            print(f"note: the plan uses GPU(s) {','.join(map(str, gpus))}, which this machine "
                  f"does not have ({torch.cuda.device_count()} visible): it was checked in every "
                  "other respect, and runs where the GPUs are")
    print(f"dry run: nothing was run or written (the study would go to {study})")


def execute(study: Path, jobs: list, rerun: str, inputs: dict[str, Any],
            command: str, quiet_max_s: float | None = None) -> int:
    """Run the study, then print the summary and the report path; 1 when a run failed.

    ``command`` is what to type to resume after Ctrl-C; ``quiet_max_s`` is --quiet-machine.
    """
    from parascale.bench.runner import existing_records, run_study
    from parascale.errors import WorkerFailure

    try:
        records = run_study(study, jobs, rerun, echo, inputs=inputs, quiet_max_s=quiet_max_s)
    except KeyboardInterrupt:
        done = len(existing_records(study, jobs))
        print(f"\ninterrupted: {done} of {len(jobs)} runs are recorded in {study}; to resume, "
              f"run {command} again (recorded runs are kept)", file=sys.stderr, flush=True)
        raise
    summarise(study)
    failed = [f for f, r in records.items() if r["status"] == "failed"]
    if failed:
        raise WorkerFailure(f"{len(failed)} of {len(records)} runs failed (reasons in the "
                            "report); run them again with --rerun failed")
    return 0


def typed_command(name: str) -> str:
    """The command line as typed, when this process was started as 'parascale <name> ...'."""
    if sys.argv[1:2] == [name]:
        return "'parascale " + shlex.join(sys.argv[1:]) + "'"
    return "the same command"


def run(args: argparse.Namespace) -> int:
    inputs, jobs, study = plan_from_args(args)
    explain(args, jobs)
    if args.dry_run:
        dry_run(jobs, study, inputs.repeat, args.rerun)
        return 0
    return execute(study, jobs, args.rerun, dataclasses.asdict(inputs), typed_command("bench"),
                   args.quiet_machine)
