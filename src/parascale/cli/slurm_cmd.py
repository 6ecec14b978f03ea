"""``parascale slurm``: run ``train`` and ``bench`` as Slurm jobs, and see how a study's jobs are.

``slurm train`` and ``slurm bench`` take exactly the options of ``train`` and ``bench`` (their
parsers are built by the same code) plus the Slurm ones (:mod:`parascale.cluster.script`), and
check all of them before a script is rendered: bad input is one line, nothing written or
submitted. ``--dry-run`` prints the job script(s); ``--submit`` writes and submits them.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from parascale.errors import UsageError, WorkerFailure

if TYPE_CHECKING:
    from parascale.config import TrainConfig

DESCRIPTION = """\
Run 'parascale train' or a 'parascale bench' study as Slurm jobs: one task per device under
srun, rank 0 hosting the rendezvous on the first node. A study becomes one job per
configuration; each files its record into STUDY/runs/<configuration>/ as bench does, so
'parascale report STUDY' works unchanged. 'parascale slurm status STUDY' shows each
configuration's job and state; a job that failed, was cancelled or ran out of time is recorded
as failed with the scheduler's reason, and submitting the study again sends only what is
missing or failed. See docs/slurm.md.
"""

EXAMPLES = """\
examples:
  parascale slurm train --workers 4 --nodes 2 --time 30 --model smallcnn --epochs 5 \\
      --out runs/cnn --setup 'module load python' --dry-run
  parascale slurm train --nodes 2 --gpus-per-node 4 --model resnet50 --dataset cifar10 \\
      --data-dir data --global-batch 1024 --out runs/r50 --submit --wait
  parascale slurm bench --workers 1,2,4 --scaling weak --batch-size 32 --epochs 3 \\
      --out studies/cnn --time 20 --submit
  parascale slurm run --workers 2 --time 10 --out runs/mine --submit train.py --epochs 3
  parascale slurm status studies/cnn
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from parascale.cli.parsers import bench_parser, train_parser
    from parascale.cluster.script import add_options

    parser = subparsers.add_parser(
        "slurm", help="run train or a bench study as Slurm jobs; status of a study's jobs",
        description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="slurm_command", metavar="{train,bench,run,status}")
    train = train_parser(sub)
    train.description = "Submit 'parascale train' as one Slurm job. " + train.description
    train.epilog = EXAMPLES
    add_options(train)
    train.set_defaults(func=run_train, option_names=option_names(train))
    bench = bench_parser(sub)
    bench.description = ("Submit a 'parascale bench' study as one Slurm job per configuration. "
                         + bench.description)
    bench.epilog = EXAMPLES
    add_options(bench, dry_run=False)  # bench's own --dry-run prints the plan and the scripts
    bench.set_defaults(func=run_bench, rerun="failed", option_names=option_names(bench))
    for action in bench._actions:  # the same options, said as they are on Slurm
        if action.dest == "rerun":
            action.help = ("which recorded runs to submit again: failed (default on Slurm: "
                           "what is missing or failed), never, always")
        if action.dest == "dry_run":
            action.help = "print the plan and every job script; write and submit nothing"
    from parascale.cli.parsers import run_parser

    script = run_parser(sub)
    script.description = ("Submit 'parascale run' of your own training script as one Slurm job "
                          "(parascale's and Slurm's options before the script). "
                          + str(script.description))
    script.epilog = EXAMPLES
    add_options(script)
    script.set_defaults(func=run_script, option_names=option_names(script))
    status = sub.add_parser("status", help="each configuration's job and state",
                            description="Show each configuration of STUDY with its Slurm job, "
                            "the job's state and the scheduler's reason; jobs that ended "
                            "without filing their run are filed as failed now.")
    status.add_argument("study", metavar="STUDY", help="the study folder (--out of slurm bench)")
    status.set_defaults(func=run_status)
    parser.set_defaults(func=lambda args: _no_command(parser))
    return parser


def option_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each value's option as the user typed it (--out, not the study_out it is kept in)."""
    return {a.dest: max(a.option_strings, key=len) if a.option_strings else a.dest.upper()
            for a in parser._actions}


def check_values(args: argparse.Namespace) -> None:
    """Every value given may reach the job script (paths, names, --setup, train's options): one
    holding a control character is refused by its option's name before anything is planned."""
    from parascale.cluster.script import check_value

    names = getattr(args, "option_names", {})
    for dest, value in vars(args).items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and dest in names:
                check_value(item, names[dest])


def _no_command(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def echo(line: str) -> None:
    print(line, flush=True)


def _job_config(args: argparse.Namespace, opts, default_out) -> tuple[dict, int, int]:
    """The run's settings as a job's tasks will have them: one worker per task, the threads
    Slurm gives each, CUDA where GPUs are asked for, and --out made absolute (the job runs
    elsewhere) or ``default_out(cfg)``; with the job's nodes and tasks per node."""
    from parascale.cli.options import config_from_args
    from parascale.cluster.script import layout

    cfg = config_from_args(args)
    if cfg.get("gpus") is not None:
        raise UsageError("--gpus names this machine's GPUs; on Slurm ask for --gpus-per-node G "
                         "(one task per GPU, each on cuda:<local rank>)")
    _no_device_memory([cfg])
    nodes, per_node = layout(cfg.get("workers"), opts)
    cfg["workers"] = nodes * per_node
    cfg.setdefault("threads", opts.cpus_per_task)
    if opts.gpus_per_node:
        cfg["device"] = "cuda"
    cfg["out"] = os.path.abspath(cfg.get("out") or default_out(cfg))
    return cfg, nodes, per_node


def _no_device_memory(configs: list[dict]) -> None:
    if any(cfg.get("device_memory") is not None for cfg in configs):
        raise UsageError("--device-memory caps the workers of parascale's own launch; srun "
                         "starts a Slurm job's tasks, and Slurm's own memory limit (sbatch "
                         "--mem-per-cpu) applies to them: leave it out")


# ---- train --------------------------------------------------------------------------------

def train_script(args: argparse.Namespace):
    """(script text, out folder, Slurm options) for ``slurm train``; UsageError for bad input."""
    from parascale.run_summary import default_out
    from parascale.cluster.script import (Script, file_pattern, job_name, options_from_args,
                                          render, train_flags)
    from parascale.config import TrainConfig
    from parascale.validation import validate
    from parascale.files import check_writable_folder
    from parascale.runtime.world import devices_elsewhere

    opts = options_from_args(args)  # its own words for --time, --setup, --python first
    check_values(args)
    cfg, nodes, per_node = _job_config(args, opts, default_out)
    with devices_elsewhere():  # the GPUs are on the nodes, not necessarily here
        checked = TrainConfig.from_dict(cfg)
        validate(checked)
        if checked.job.task is not None:  # a user's task: loaded and tried here, as train does
            from parascale import tasks

            tasks.preflight(checked)
        else:
            _check_builtin(checked)
    check_writable_folder(cfg["out"])
    out = Path(cfg["out"])
    subject = checked.job.task or f"{checked.job.model} on {checked.data.dataset}"
    script = Script(name=job_name(f"ps-train-{out.name}"), what=f"parascale train {subject}, "
                    f"{cfg['workers']} worker(s); record in {out}/record.json",
                    train=[*train_flags({k: v for k, v in cfg.items() if k != "out"}),
                           "--out", str(out)],
                    output=file_pattern(out) + "-slurm-%j.out",
                    nodes=nodes, tasks_per_node=per_node)
    return render(script, opts), out, opts


def _check_builtin(checked: TrainConfig) -> None:
    """The registries' model and data (of a TrainConfig), where this machine can see them."""
    from parascale import data, models

    models.check(checked.job.model)
    if data.elsewhere(checked):
        print(f"parascale: warning: --data-dir {checked.data.data_dir} is not on this machine; "
              "the job reads it on the nodes (and says so if it is missing there too)",
              file=sys.stderr, flush=True)
    else:
        data.check(checked)


def script_job(args: argparse.Namespace):
    """(script text, out folder, Slurm options) for ``slurm run script.py``: the job runs
    ``parascale run`` on every task, which joins srun's world; UsageError for bad input."""
    from parascale.bench.scripts import SCRIPT, SCRIPT_ARGS, check_job, command_tail, run_options
    from parascale.cli.parsers import script_and_args
    from parascale.cluster.script import (Script, file_pattern, job_name, options_from_args,
                                          render, train_flags)
    from parascale.config import TrainConfig
    from parascale.files import check_writable_folder
    from parascale.runtime.world import devices_elsewhere
    from parascale.validation import validate

    opts = options_from_args(args)
    check_values(args)
    script, argv = script_and_args(list(args.command))
    # '--' right after the script passes what follows to it as it is, Slurm's options too
    typed = list(args.command)[list(args.command)[:1] == ["--"]:]
    slurm_names = {a for a in args.option_names.values() if a.startswith("--")}
    mistaken = next((a.partition("=")[0] for a in argv if a.partition("=")[0] in slurm_names
                     and typed[1:2] != ["--"]), None)
    if mistaken:
        raise UsageError(f"{mistaken} comes after {script.name}, so it would go to the script, "
                         f"not to Slurm: give it before the script, or write -- after "
                         f"{script.name} to pass it to the script")
    cfg, nodes, per_node = _job_config(args, opts, lambda cfg: f"runs/{script.stem}-slurm")
    with devices_elsewhere():
        validate(TrainConfig.from_dict(cfg))
        check_job(cfg, {"script": str(script)})
    check_writable_folder(cfg["out"])
    out = Path(cfg["out"])
    job = Script(name=job_name(f"ps-run-{out.name}"),
                 what=f"parascale run {script.name}, {cfg['workers']} worker(s); record in "
                 f"{out}/record.json",
                 train=[*train_flags(run_options({k: v for k, v in cfg.items() if k != "out"})),
                        "--out", str(out),
                        *command_tail({SCRIPT: str(script), SCRIPT_ARGS: argv})],
                 output=file_pattern(out) + "-slurm-%j.out", nodes=nodes, tasks_per_node=per_node,
                 command="run")
    return render(job, opts), out, opts


def run_script(args: argparse.Namespace) -> int:
    return _submit_one(args, *script_job(args))


def run_train(args: argparse.Namespace) -> int:
    return _submit_one(args, *train_script(args))


def _submit_one(args: argparse.Namespace, text: str, out: Path, _opts) -> int:
    """Print the job script (--dry-run), or submit it, and with --wait say how it ended."""
    from parascale.cluster import scheduler
    from parascale.files import atomic_write_text

    if args.dry_run:
        print(text, end="")
        return 0
    why = scheduler.available()
    if why:
        raise UsageError(f"--submit: {why}; --dry-run prints the script to submit elsewhere")
    path = atomic_write_text(Path(f"{out}-slurm.sh"), text)
    job_id = scheduler.submit(path)
    output = Path(f"{out}-slurm-{job_id}.out")
    echo(f"submitted job {job_id} (script {path}); output: {output}; record: {out}/record.json")
    if not args.wait:
        return 0
    try:
        state = _wait_one(job_id, output)
    except KeyboardInterrupt:
        print(f"\nstopped waiting: job {job_id} goes on (scancel {job_id} stops it)",
              file=sys.stderr, flush=True)
        raise
    return _train_outcome(job_id, state, out, output)


def _wait_one(job_id: str, output: Path):
    import time

    from tqdm import tqdm

    from parascale.cluster import scheduler

    bar = tqdm(total=1, unit="job", desc=f"job {job_id}", mininterval=0.5, disable=None,
               leave=False)
    try:
        while True:
            state = scheduler.states([job_id], {job_id: output})[job_id]
            bar.set_postfix_str(state.state.lower())
            if not state.active:
                bar.update(1)
                return state
            time.sleep(2.0)
    finally:
        bar.close()


def _train_outcome(job_id: str, state, out: Path, output: Path) -> int:
    from parascale import record as rec
    from parascale.run_summary import done_lines
    from parascale.cluster.filing import last_error
    from parascale.safejson import Refused

    try:
        record = rec.read_record(out / rec.RECORD_NAME)
    except Refused:
        record = None
    if record is None or state.failed:
        detail = last_error(output)  # the job's own line: a --data-dir missing on the nodes
        raise WorkerFailure(f"Slurm job {job_id} ended {state.describe()}"
                            + (" without a record" if record is None else "")
                            + (f": {detail}" if detail else "") + f" (output: {output})")
    if record["status"] != "ok":
        raise WorkerFailure(f"{record['reason']} (record: {out}/record.json)")
    echo(f"job {job_id} {state.state}")
    print("\n".join(done_lines(record)))
    echo(f"record: {out}/record.json")
    return 0


# ---- bench --------------------------------------------------------------------------------

def study_plan(args: argparse.Namespace):
    """(inputs, jobs, study, Slurm options) for ``slurm bench``; UsageError for bad input."""
    from parascale.bench.study import workers_elsewhere
    from parascale.bench.session import plan_from_args
    from parascale.cli.options import config_from_args
    from parascale.cluster import scheduler
    from parascale.cluster.script import options_from_args
    from parascale.cluster.study import study_train
    from parascale.runtime.env import available_cores

    if args.dry_run == args.submit:
        raise UsageError("give --dry-run (print the plan and the job scripts) or --submit")
    opts = options_from_args(args)  # --wait without --submit too
    check_values(args)
    if args.quiet_machine is not None:
        raise UsageError("--quiet-machine waits for this machine to be quiet; on Slurm the "
                         "scheduler gives each job its cores")
    if getattr(args, "gpus", None) is not None:
        raise UsageError("--gpus names this machine's GPUs; on Slurm ask for --gpus-per-node G")
    if getattr(args, "model", None) is not None:
        # before asking sinfo, which waits seconds for a controller that does not answer: a
        # misspelt model is said at once (the plan checks every configuration's again)
        from parascale import models

        models.check(args.model)
    per_node = opts.gpus_per_node or \
        (scheduler.cpus_per_node(opts.partition) or available_cores()) // opts.cpus_per_task
    args.threads = getattr(args, "threads", opts.cpus_per_task)
    if opts.gpus_per_node:
        args.device = "cuda"
    # the jobs' cores are the nodes' and Slurm hands them out: the trainer's check of a local
    # launch against this machine's cores does not apply, so plan past it, then drop the flag
    lifted = not hasattr(args, "oversubscribe")
    args.oversubscribe = True
    with workers_elsewhere(max(1, per_node) * opts.nodes):
        args.dry_run = True  # plan as for another machine: its GPUs are on the nodes
        try:
            inputs, jobs, study = plan_from_args(args, config_from_args(args))
        finally:
            args.dry_run = not args.submit
    _no_device_memory([job.train for job in jobs])
    if lifted:
        for held in (inputs.parameters, *(j.params for j in jobs), *(j.train for j in jobs)):
            held.pop("oversubscribe", None)
    jobs = [dataclasses.replace(job, train=study_train(job, opts)) for job in jobs]
    return inputs, jobs, study, opts


def run_bench(args: argparse.Namespace) -> int:
    from parascale.bench.study import plan_table
    from parascale.bench.session import explain, summarise, typed_command
    from parascale.cluster import scheduler
    from parascale.cluster.study import (failed_runs, status_table, study_script, submit,
                                         wait)

    inputs, jobs, study, opts = study_plan(args)
    explain(args, jobs)
    scripts = [(job, study_script(study, job, opts)) for job in jobs if job.skip_reason is None]
    if args.dry_run:
        print(plan_table(jobs, inputs.repeat))
        for job, text in scripts:
            print(f"\n# ---- {study / 'slurm' / (job.folder + '.sh')} ----")
            print(text, end="")
        print(f"\ndry run: nothing was written or submitted ({len(scripts)} job script(s) for "
              f"{study})")
        return 0
    why = scheduler.available()
    if why:
        raise UsageError(f"--submit: {why}; --dry-run prints the scripts")
    submitted = submit(study, jobs, opts, args.rerun, dataclasses.asdict(inputs), echo)
    echo(f"{len(submitted)} job(s) submitted for {study}")
    if not args.wait:
        echo(f"see how they are doing: parascale slurm status {study}; once they are done: "
             f"parascale report {study}")
        return 0
    try:
        rows = wait(study, jobs, echo)
    except KeyboardInterrupt:
        print(f"\nstopped waiting: the jobs go on; parascale slurm status {study} shows them",
              file=sys.stderr, flush=True)
        raise
    print(status_table(rows))
    summarise(study)
    failed = failed_runs(study, jobs)
    if failed:
        raise WorkerFailure(f"{len(failed)} of {len(jobs)} runs failed (reasons above and in "
                            f"the report); {typed_command('slurm')} again submits them again")
    return 0


# ---- status -------------------------------------------------------------------------------

def run_status(args: argparse.Namespace) -> int:
    from parascale.bench.runner import planned_jobs
    from parascale.cluster.study import check_study, refresh, status_table

    study = Path(args.study)
    check_study(study)
    jobs = planned_jobs(study)
    rows = refresh(study, jobs)
    print(status_table(rows))
    counts: dict[str, int] = {}
    for row in rows:
        key = row.state.lower() if row.active else (row.outcome or row.state.lower())
        counts[key] = counts.get(key, 0) + 1
    print(f"{len(rows)} configuration(s): " + ", ".join(f"{n} {k}" for k, n in counts.items()),
          file=sys.stderr if not rows else sys.stdout)
    return 0
