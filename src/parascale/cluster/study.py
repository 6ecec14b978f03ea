"""A study on Slurm: one job per configuration, filed into the study folder like ``bench``.

Layout, beside what :mod:`parascale.bench.runner` keeps::

    STUDY/slurm/<folder>.sh            the job script of a configuration (as --dry-run prints it)
    STUDY/slurm/<folder>-<job id>.out  its output (Slurm's --output)
    STUDY/slurm/jobs.json              the ledger: which job was last submitted for each folder
    STUDY/slurm/<folder>.filed         the job id whose run is filed in runs/<folder>/

A job trains its configuration into ``.running/<folder>`` with ``srun parascale train``, then
files it with :mod:`.filing` (the runner's own code: same record, same study block), and writes
the ``.filed`` marker. A job the scheduler ended before that (cancelled, out of time, node
failure) is filed as failed with the scheduler's reason by whoever looks next: ``status``,
``--wait`` or the next ``--submit``. Submitting again sends only what is missing or failed
(``--rerun``), never a configuration whose job is still queued or running.
"""
from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parascale import safejson
from parascale import record as rec
from parascale.bench.runner import RUNS, STAGING, StudyRunner, existing_records
from parascale.bench import scripts
from parascale.bench.study import Job, run_train
from parascale.columns import aligned
from parascale.cluster import scheduler
from parascale.cluster.script import (Script, SlurmOptions, file_pattern, job_name, layout,
                                      render, train_flags)
from parascale.errors import UsageError
from parascale.files import atomic_write_text
from parascale.safejson import Refused, load

SLURM, LEDGER, POLL_S = "slurm", "jobs.json", 2.0


def output_path(study: Path, folder: str, job_id: str) -> Path:
    return study / SLURM / f"{folder}-{job_id}.out"


def study_train(job: Job, opts: SlurmOptions) -> dict[str, Any]:
    """The train options of ``job`` as a Slurm job runs them: threads from --cpus-per-task
    unless given (the cores Slurm gives each task, not this machine's), GPUs by task rather
    than by list."""
    train = {"save_model": False, "threads": opts.cpus_per_task, **job.train}
    if opts.gpus_per_node:
        train.pop("gpus", None)
        train["device"] = "cuda"
    return scripts.run_options(train) if scripts.is_script(job.params) else train


def study_script(study: Path, job: Job, opts: SlurmOptions) -> str:
    """The job script of one configuration of ``study``."""
    study = study.resolve()
    nodes, per_node = layout(job.world_size, opts)
    staging = study / STAGING / job.folder
    q = shlex.quote
    script = Script(
        name=job_name(f"ps-{study.name}-{job.folder}"),
        what=f"parascale study {study.name}, configuration {job.folder}: {job.label or job.folder}",
        # the study's --tensorboard DIR becomes DIR/<folder> here, once: study_train runs twice
        train=[*train_flags(study_train(dataclasses.replace(job, train=run_train(job)), opts)),
               "--out", str(staging),
               *scripts.command_tail(job.params)],
        command="run" if scripts.is_script(job.params) else "train",
        output=file_pattern(study / SLURM / job.folder) + "-%j.out",
        nodes=nodes, tasks_per_node=per_node,
        before=["# the remains of an earlier attempt at this configuration",
                f"rm -rf -- {q(str(staging))}", ""],
        after=["", "# file the run into the study (its record, or a failed one saying why)",
               f'{q(opts.python)} -m parascale.cluster.filing {q(str(study))} {q(job.folder)} '
               '"$SLURM_JOB_ID" "$code"'])
    return render(script, opts)


# ---- the ledger ---------------------------------------------------------------------------

def read_ledger(study: Path) -> dict[str, dict[str, Any]]:
    try:
        data = load(study / SLURM / LEDGER, max_bytes=4 << 20)
    except Refused:
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict) and "job_id" in v} \
        if isinstance(data, dict) else {}


def write_ledger(study: Path, ledger: dict[str, dict[str, Any]]) -> None:
    atomic_write_text(study / SLURM / LEDGER, safejson.dumps(ledger, indent=2, sort_keys=True) + "\n")


def filed_by(study: Path, folder: str) -> str | None:
    """The job id whose run is filed in runs/<folder>, from the job's marker."""
    try:
        return (study / SLURM / f"{folder}.filed").read_text().strip() or None
    except OSError:
        return None


def mark_filed(study: Path, folder: str, job_id: str) -> None:
    atomic_write_text(study / SLURM / f"{folder}.filed", job_id + "\n")


# ---- status --------------------------------------------------------------------------------

@dataclass
class Row:
    """One configuration of the study as ``status`` shows it."""

    folder: str
    job_id: str | None
    state: str  # the scheduler's state, or: recorded, not submitted
    outcome: str  # the record's status (ok, failed, oom, skipped) or '' while none is filed
    reason: str  # the scheduler's reason or the record's

    @property
    def active(self) -> bool:
        return self.state in scheduler.ACTIVE


def refresh(study: Path, jobs: Sequence[Job]) -> list[Row]:
    """Each configuration's job and state; a job that ended without filing its run (cancelled,
    out of time, failed before filing) is filed now as failed with the scheduler's reason."""
    ledger = read_ledger(study)
    ids = sorted({entry["job_id"] for entry in ledger.values()})
    outputs = {entry["job_id"]: output_path(study, folder, entry["job_id"])
               for folder, entry in ledger.items()}
    known = scheduler.states(ids, outputs) if ids else {}
    records = existing_records(study, jobs)
    runner = StudyRunner(study, jobs)
    rows = []
    for job in jobs:
        entry, record = ledger.get(job.folder), records.get(job.folder)
        if entry is None:
            rows.append(Row(job.folder, None, "recorded" if record else "not submitted",
                            record["status"] if record else "",
                            (record or {}).get("reason") or ""))
            continue
        job_id = entry["job_id"]
        state = known[job_id]
        unfiled = filed_by(study, job.folder) != job_id and not state.active
        if unfiled and stands(record, job_id) and \
                not (study / STAGING / job.folder / rec.RECORD_NAME).is_file():
            mark_filed(study, job.folder, job_id)  # killed between its record and the marker
        elif unfiled:
            output = output_path(study, job.folder, job_id)
            why = state.describe() if state.state != "UNKNOWN" else (
                "UNKNOWN: the scheduler no longer remembers it and it filed no record")
            record = runner.file_elsewhere(
                job, f"Slurm job {job_id} ended without filing its run: {why}; output in "
                f"{output}")
            mark_filed(study, job.folder, job_id)
        filed = filed_by(study, job.folder) == job_id
        outcome = record["status"] if filed and record else ""
        reason = state.reason if state.active or not record else (record.get("reason") or "")
        rows.append(Row(job.folder, job_id, state.state, outcome, reason))
    return rows


def stands(record: dict[str, Any] | None, job_id: str) -> bool:
    """Whether a filed record stands as job ``job_id``'s outcome when the job left no marker.
    A record is never replaced by a guess when it is ok (or another real outcome: oom,
    skipped), nor when it is the failure the job filed itself (its reason names the job); a
    failed record of an earlier job is what this job was submitted to replace."""
    if record is None:
        return False
    return record.get("status") != "failed" or \
        str(record.get("reason") or "").startswith(f"Slurm job {job_id}:")


def status_table(rows: Sequence[Row]) -> str:
    head = ("configuration", "job", "state", "record", "reason")
    cells = [(r.folder, r.job_id or "-", r.state, r.outcome or "-", r.reason or "")
             for r in rows]
    return aligned([head, *cells])


# ---- submitting ----------------------------------------------------------------------------

def submit(study: Path, jobs: Sequence[Job], opts: SlurmOptions, rerun: str,
           inputs: dict[str, Any] | None, echo: Callable[[str], None]) -> list[str]:
    """Write the plan and submit a job for every configuration that is missing, or failed
    (``rerun`` as bench's), and whose job is not queued or running; the job ids submitted."""
    scripts = {job.folder: study_script(study, job, opts) for job in jobs
               if job.skip_reason is None}  # every script renders before anything is written
    runner = StudyRunner(study, jobs, rerun, echo)
    runner.prepare(inputs)
    (study / SLURM).mkdir(exist_ok=True)
    rows = {row.folder: row for row in refresh(study, jobs)}
    records = existing_records(study, jobs)
    ledger, submitted = read_ledger(study), []
    for job in jobs:
        row, record = rows[job.folder], records.get(job.folder)
        if job.skip_reason is not None:
            if record is None:
                runner._skip(job, job.skip_reason)
            echo(f"{job.folder}: skipped ({job.skip_reason})")
            continue
        if row.active:
            echo(f"{job.folder}: job {row.job_id} is {row.state.lower()}, left alone")
            continue
        if record is not None and runner._keep(record):
            echo(f"{job.folder}: recorded ({record['status']}), kept (--rerun {rerun})")
            continue
        path = study / SLURM / f"{job.folder}.sh"
        atomic_write_text(path, scripts[job.folder])
        job_id = scheduler.submit(path)
        ledger[job.folder] = {"job_id": job_id, "script": str(path), "submitted": rec.now()}
        write_ledger(study, ledger)  # after each: a failing sbatch loses none of the others
        submitted.append(job_id)
        echo(f"{job.folder}: submitted as job {job_id}")
    return submitted


def wait(study: Path, jobs: Sequence[Job], echo: Callable[[str], None],
         poll_s: float = POLL_S) -> list[Row]:
    """Wait until no job of the study is queued or running (a progress bar of the finished
    ones), filing those that end without a record; the final rows."""
    from tqdm import tqdm

    rows = refresh(study, jobs)
    bar = tqdm(total=len(rows), unit="job", desc="slurm jobs", mininterval=0.5, disable=None,
               leave=False)
    try:
        while True:
            active = [r for r in rows if r.active]
            bar.n = len(rows) - len(active)
            counts: dict[str, int] = {}
            for r in active:
                counts[r.state.lower()] = counts.get(r.state.lower(), 0) + 1
            bar.set_postfix_str(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
            if not active:
                return rows
            time.sleep(poll_s)
            rows = refresh(study, jobs)
    finally:
        bar.close()


def check_study(study: Path) -> None:
    """UsageError unless ``study`` is a study folder (status reads, never creates)."""
    if study.exists() and not study.is_dir():
        raise UsageError(f"{study} is a file, not a study folder; give the --out of a "
                         "'parascale slurm bench --submit'")
    if not study.is_dir():
        raise UsageError(f"study folder {study} does not exist; give the --out of a "
                         "'parascale slurm bench --submit'")
    if not (study / "plan.json").is_file():
        raise UsageError(f"{study} is not a study folder (no plan.json); give the --out of a "
                         "'parascale slurm bench --submit'")


def failed_runs(study: Path, jobs: Sequence[Job]) -> list[str]:
    return [f for f, r in existing_records(study, jobs).items() if r["status"] == "failed"]


__all__ = ["study_script", "submit", "refresh", "wait", "status_table", "check_study",
           "read_ledger", "mark_filed", "output_path", "RUNS"]
