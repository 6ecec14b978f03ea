"""A study as ``parascale bench`` runs it, shared by the commands that run one (bench, demo,
slurm bench): the plan from the command line's values, what it cannot show, a dry run, running
it with a resumable interrupt, and the summary at the end."""
from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from parascale.batch import DEFAULT_BATCH
from parascale.errors import UsageError


def check_quiet(max_s: float | None) -> float | None:
    """--quiet-machine's value: a wait of 0 seconds or more, or None."""
    if max_s is not None and not max_s >= 0:
        raise UsageError(f"--quiet-machine waits at most MAX_S seconds, which must be 0 or more, "
                         f"got {max_s:g}")
    return max_s


def _name_part(inputs: Any, name: str, default: str) -> str:
    value = inputs.variables.get(name, inputs.parameters.get(name, default))
    values = value if isinstance(value, list) else [value]
    text = "+".join(str(v) for v in values)
    if "$" in text or text.startswith("="):
        text = name
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:40] or default


def default_out(inputs: Any) -> Path:
    script = inputs.parameters.get("script")
    if isinstance(script, str):  # a study of a script: named by it
        return Path("studies") / (re.sub(r"[^A-Za-z0-9.+-]+", "_", Path(script).stem)[:40]
                                  or "script")
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


def plan_from_args(args: argparse.Namespace, options: dict[str, Any]):
    """(inputs, jobs, study folder) from bench's command line, ``options`` its training options
    (``cli.options.config_from_args``); UsageError for any bad input."""
    from parascale.bench import maxbatch
    from parascale.bench.studyfile import load_study_file
    from parascale.bench.values import parse_assignment, parse_variable
    from parascale.bench.study import combine, make_jobs, with_tensorboard
    from parascale.runtime.world import devices_elsewhere

    tensorboard = options.pop("tensorboard", None)  # the study's folder, not a value of its plan
    assignments = [parse_assignment(text) for text in args.param]
    assignments += [(name, value) for name, value in (("script", args.script),
                                                      ("script_args", args.script_args))
                    if value is not None]
    file = load_study_file(args.config) if args.config else None
    wants_max = maxbatch.take(file["parameters"] if file else None, options, assignments)
    named = {name for name, _ in assignments} | set((file or {}).get("parameters", {}))
    args.default_scaling = None if "script" in named else \
        default_scaling(args, options, assignments)
    scaling = args.default_scaling or args.scaling
    if scaling == "weak" and args.default_scaling and "batch_size" not in options \
            and "batch_size" not in {name for name, _ in assignments}:
        options["batch_size"] = DEFAULT_BATCH
    check_quiet(args.quiet_machine)
    inputs = combine(
        file, options, assignments,
        [parse_variable(text) for text in args.var], scaling, args.workers_spec,
        args.repeat, args.baseline)
    study = Path(args.study_out) if args.study_out else default_out(inputs)
    from parascale.files import check_writable_folder

    check_writable_folder(study)  # before the configurations' checks, which build their data
    # a dry run plans a GPU study on any machine; a real run needs the GPUs here
    with devices_elsewhere() if args.dry_run else contextlib.nullcontext():
        jobs = with_tensorboard(make_jobs(inputs), tensorboard)
    if wants_max:
        maxbatch.resolve(jobs, args.dry_run, largest_batch, echo)
        inputs.parameters["batch_size"] = maxbatch.MAX  # the plan as given, in plan.json
    return inputs, jobs, study


def largest_batch(options: dict[str, Any]) -> int:
    """--batch-size max: the batch search on the study's model and data, before planning. On
    the CPU each of up to one worker per core gets an equal share of the budget."""
    import psutil

    from parascale import data, models
    from parascale.bench.maxbatch import SEARCH_FIELDS
    from parascale.batchfind.largest import SHARE_OF_FREE, largest
    from parascale.config import TrainConfig
    from parascale.validation import validate
    from parascale.runtime.env import available_cores

    fields = {k: v for k, v in options.items() if k in SEARCH_FIELDS}
    cfg = TrainConfig.of(**fields)
    validate(cfg)
    if cfg.job.task is None:  # a task is loaded and tried by the search itself
        models.check(cfg.job.model)
        data.check(cfg)
    gpus = options.get("gpus")
    budget = None if gpus else \
        int(SHARE_OF_FREE * psutil.virtual_memory().available / available_cores())
    workers = len(gpus) if gpus else available_cores()
    # the largest N's batches must fit the data: each worker's share of the training set
    found, _, _ = largest(cfg, gpus[0] if gpus else None, budget, 1 << 16,
                          f" (half the memory free now, over {available_cores()} workers)",
                          share=workers)
    if found.best is None:
        raise UsageError(f"batch_size max: not even a batch of 1 of "
                         f"{cfg.job.task or cfg.job.model} fits")
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
