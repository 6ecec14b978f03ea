"""Running a study: one training job after another, one record per run, resumable at any point.

Layout of a study folder::

    STUDY/plan.json                  the resolved plan (written atomically before the first run)
    STUDY/runs/<folder>/record.json  one per run: <config id>, -r<k> for repeat k > 1
    STUDY/.running/<folder>/         where the run in progress trains (removed once filed)
    STUDY/.lock                      held while a bench runs the study (one at a time)

Each run trains into ``.running/<folder>`` and is then *filed*: its record, with the ``study``
block added, is written atomically to ``runs/<folder>/record.json``. So a record in ``runs/`` is
always complete and labelled, and an earlier record of the same run (``--rerun always`` or
``failed``) is only replaced once its successor exists. A study killed after a run finished but
before it was filed loses nothing: the next invocation files the finished record first.

A study folder holds one plan at a time. Running a *different* plan in it (other settings, not
just more worker counts or repeats) replaces ``plan.json`` and says so; the earlier plan's runs
stay in ``runs/`` but are kept apart: the report of the folder shows only the runs of its plan
and lists the others as not in it. Growing a plan (more worker counts, more repeats, baselines
added) resumes as usual. A recorded run whose settings differ from what the plan now asks for
(threads per worker change when the largest N does) is run again rather than kept.

An out-of-memory result is a result: it is recorded (status ``oom``), and every larger per-device
batch of the same configuration otherwise (same model, data, devices, workers, strategy...) is
recorded as ``skipped`` with a reason naming the batch and run that failed. Nothing is printed
here except through the ``echo`` callback.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from parascale import record as rec
from parascale import runrecord, safejson, sync
from parascale.bench import scripts
from parascale.bench.study import Job, run_train
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.files import atomic_write_text
from parascale.run_summary import judged
from parascale.runtime.staging import replace_set
from parascale.safejson import Refused, read_plan
from parascale.tasks import recorded_config

__all__ = ["RERUN", "StudyRunner", "run_study", "existing_records", "planned_jobs"]

RERUN = ("never", "failed", "always")
RUNS, STAGING, PLAN, LOCK = "runs", ".running", "plan.json", ".lock"


def _read(path: Path) -> dict[str, Any] | None:
    """A complete record at ``path``, or None (missing, unreadable, not a record)."""
    try:
        return rec.read_record(path)  # within limits and with checked types: files can be anything
    except Refused:
        return None


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@contextlib.contextmanager
def _locked(study: Path) -> Iterator[None]:
    """One bench at a time per study folder; the lock dies with its process, even by SIGKILL."""
    with open(study / LOCK, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(f"another parascale bench is running on {study}; wait for it or "
                             "use another --out") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def existing_records(study: Path, jobs: Sequence[Job]) -> dict[str, dict[str, Any]]:
    """The filed records of ``jobs`` in ``study`` (read only; for --dry-run)."""
    found = {}
    for job in jobs:
        record = _read(study / RUNS / job.folder / rec.RECORD_NAME)
        if record is not None:
            found[job.folder] = record
    return found


class StudyRunner:
    """Runs the jobs of one study folder in order; see the module docstring."""

    def __init__(self, study: Path, jobs: Sequence[Job], rerun: str = "never",
                 echo: Callable[[str], None] = lambda line: None,
                 quiet_max_s: float | None = None):
        if rerun not in RERUN:
            raise UsageError(f"--rerun must be one of {', '.join(RERUN)}, got {rerun!r}")
        if study.exists() and not study.is_dir():
            raise UsageError(f"--out {study} exists and is not a folder")
        self.study, self.jobs, self.rerun, self.echo = Path(study), list(jobs), rerun, echo
        self.name = self.study.resolve().name
        self.oom: dict[str, tuple[int, str]] = {}  # memory key -> (smallest oom batch, config)
        self.records: dict[str, dict[str, Any]] = {}  # folder -> final record
        self.durations: list[float] = []
        self.quiet_max_s = quiet_max_s  # --quiet-machine: wait up to this long before each run
        self.quiet: dict[str, dict[str, Any]] = {}  # folder -> what the wait saw
        self.plan_change = "new"

    # -- files ------------------------------------------------------------------------------

    def write_plan(self, inputs: dict[str, Any] | None = None) -> Path:
        runs = [{"folder": j.folder, "config_id": j.config_id, "repeat": j.repeat,
                 "baseline": j.baseline, "scaling": j.scaling, "workers": j.world_size,
                 "per_device_batch": j.per_device_batch, "global_batch": j.global_batch,
                 "skip_reason": j.skip_reason, "params": j.params, "train": j.train}
                for j in self.jobs]
        plan = {"schema": rec.PLAN_SCHEMA, "name": self.name, "written": rec.now(),
                "inputs": inputs, "runs": runs}
        return atomic_write_text(self.study / PLAN,
                                 safejson.dumps(plan, indent=2, default=str) + "\n")

    def _study_block(self, job: Job) -> dict[str, Any]:
        block = {"name": self.name, "config_id": job.config_id, "scaling": job.scaling,
                 "repeat": job.repeat, "baseline": job.baseline, "params": job.params}
        if job.folder in self.quiet:
            block["quiet_machine"] = self.quiet[job.folder]
        return block

    def _file(self, job: Job, record: dict[str, Any]) -> dict[str, Any]:
        """Label ``record`` and write it as the run's final record (the model first, if any)."""
        final = self.study / RUNS / job.folder
        staging = self.study / STAGING / job.folder
        final.mkdir(parents=True, exist_ok=True)
        # the run's model, console log and traces
        replace_set(staging, final, (rec.MODEL_NAME, rec.LOG_NAME, rec.TRACES_NAME))
        record["study"] = self._study_block(job)
        if isinstance(record.get("config"), dict):
            record["config"]["out"] = str(final)
        rec.write(final, record)
        shutil.rmtree(staging, ignore_errors=True)
        self.records[job.folder] = record
        return record

    def _recover(self, job: Job) -> dict[str, Any] | None:
        """The job's final record, filing a finished-but-unfiled one and labelling an unlabelled
        one first (both are what an interruption at the wrong moment leaves)."""
        staged = _read(self.study / STAGING / job.folder / rec.RECORD_NAME)
        if staged is not None:
            self.echo(f"filed a run that finished before the study was interrupted: {job.folder}")
            return self._file(job, staged)
        record = _read(self.study / RUNS / job.folder / rec.RECORD_NAME)
        if record is not None and not isinstance(record.get("study"), dict):
            return self._file(job, record)
        return record

    @staticmethod
    def _stale(job: Job, record: dict[str, Any] | None) -> str | None:
        """Why a recorded run does not match what the plan now asks of it, or None.

        Only settings both sides state are compared: an older record lacking one is not stale.
        """
        config = record.get("config") if isinstance(record, dict) else None
        if not isinstance(config, dict) or job.skip_reason is not None:
            return None
        try:
            wanted = TrainConfig.from_dict(job.train).to_dict()
        except (TypeError, ValueError):
            return None
        config, given = _flat(config), _flat(job.train)
        for name in sorted(given):
            # where a run writes is no setting of the run (--tensorboard: a folder per run)
            if name in ("out", "save_model", "tensorboard") or name not in config:
                continue
            had, want = (json.dumps(v, sort_keys=True, default=str)
                         for v in (config[name], wanted.get(name)))
            if had != want:
                return f"{name} was {had}, the plan now gives {want}"
        return None

    def _keep(self, record: dict[str, Any] | None) -> bool:
        if record is None or self.rerun == "always":
            return False
        return self.rerun == "never" or record["status"] != "failed"

    # -- out-of-memory ----------------------------------------------------------------------

    def _remember(self, job: Job, record: dict[str, Any]) -> None:
        if record.get("status") != "oom":
            return
        batch = (record.get("derived") or {}).get("per_device_batch") or job.per_device_batch
        if isinstance(batch, int):
            known = self.oom.get(job.memory_key)
            if known is None or batch < known[0]:
                self.oom[job.memory_key] = (batch, job.folder)

    def _oom_reason(self, job: Job) -> str | None:
        known = self.oom.get(job.memory_key)
        if known is None or job.per_device_batch is None or job.per_device_batch < known[0]:
            return None
        batch, where = known
        if job.per_device_batch == batch:
            return f"not run: per-device batch {batch} already ran out of memory in {where}"
        return (f"not run: per-device batch {job.per_device_batch} is larger than {batch}, "
                f"which ran out of memory in {where}")

    def _partner_oom(self, job: Job) -> str | None:
        """A baseline is pointless when its synchronised run ran out of memory."""
        if not job.baseline:
            return None
        partner = job.folder.replace("-baseline", "", 1)
        record = self.records.get(partner)
        if record is not None and record.get("status") == "oom":
            return f"not run: the synchronised run {partner} ran out of memory"
        return None

    # -- running ----------------------------------------------------------------------------

    def _skip(self, job: Job, reason: str, status: str = "skipped") -> dict[str, Any]:
        derived = {"world_size": job.world_size, "per_device_batch": job.per_device_batch,
                   "global_batch": job.global_batch or job.train.get("global_batch")}
        settings = TrainConfig.from_dict({**job.train, "workers": job.world_size})
        sync.settle(settings)  # the record names the strategy and its options
        config = recorded_config(settings)
        config["save_model"] = job.train.get("save_model", False)
        return self._file(job, runrecord.failed(config, status, reason, derived).to_dict())

    def file_elsewhere(self, job: Job, reason: str) -> dict[str, Any]:
        """File the run of ``job`` that trained outside this process (a Slurm job trains into
        ``.running/<folder>`` as :meth:`_execute` does): its record, or, when it left none, a
        failed record saying ``reason``."""
        if _read(self.study / STAGING / job.folder / rec.RECORD_NAME) is not None:
            return self._recover(job)  # type: ignore[return-value]
        shutil.rmtree(self.study / STAGING / job.folder, ignore_errors=True)
        return self._skip(job, reason, status="failed")

    def prepare(self, inputs: dict[str, Any] | None = None) -> None:
        """Write the plan of a study whose runs train elsewhere (Slurm jobs), as :meth:`run`
        does before its first run, saying how it differs from the folder's earlier plan."""
        self.study.mkdir(parents=True, exist_ok=True)
        with _locked(self.study):
            (self.study / RUNS).mkdir(exist_ok=True)
            self.plan_change = self._compare_plans(self._earlier_plan())
            self.write_plan(inputs)

    def _execute(self, job: Job) -> dict[str, Any]:
        from parascale.training import train

        staging = self.study / STAGING / job.folder
        shutil.rmtree(staging, ignore_errors=True)  # the remains of an interrupted attempt
        staging.parent.mkdir(parents=True, exist_ok=True)
        config = {"save_model": False, **run_train(job), "out": str(staging)}
        try:
            record = scripts.run_job(config, job.params) \
                if scripts.is_script(job.params) else train(config)
        except KeyboardInterrupt:
            if not (staging / rec.RECORD_NAME).exists():  # nothing finished: leave no trace
                shutil.rmtree(staging, ignore_errors=True)
            raise
        return self._file(job, record)

    def run(self, inputs: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """Write the plan (``inputs`` are recorded in it) and run every job not already done;
        return the final record of each job by folder."""
        self.study.mkdir(parents=True, exist_ok=True)
        with _locked(self.study):
            (self.study / RUNS).mkdir(exist_ok=True)
            for leftover in [*self.study.glob(".*.tmp"), *self.study.glob(f"{RUNS}/*/.*.tmp")]:
                leftover.unlink(missing_ok=True)  # an atomic write cut short by a kill
            self.plan_change = self._compare_plans(self._earlier_plan())
            self.write_plan(inputs)
            return self._run()

    def _earlier_plan(self) -> dict[str, Any] | None:
        try:
            return read_plan(self.study / PLAN)
        except Refused:  # none, or not one we can read: the study starts a plan afresh
            return None

    def _compare_plans(self, earlier: dict[str, Any] | None) -> str:
        """'new', 'same', 'grown' or 'changed' (said, with what happens to the earlier runs)."""
        if earlier is None:
            return "new"
        before = {r.get("folder") for r in earlier["runs"] if isinstance(r, dict)}
        now = {job.folder for job in self.jobs}
        if before == now:
            return "same"
        if before <= now:
            self.echo(f"the plan grew: {len(now - before)} run(s) added to the {len(before)} of "
                      f"the earlier plan in {self.study}")
            return "grown"
        apart = before - now
        what = "a larger plan" if now <= before else "a different plan"
        self.echo(f"note: {self.study} held {what} ({len(before)} runs, written "
                  f"{earlier.get('written', '?')}); this one shares {len(before & now)} of them. "
                  f"The other {len(apart)} stay in {self.study / RUNS} but are kept apart: the "
                  "report shows only this plan's runs and lists them as not in the plan (use "
                  "another --out to keep studies in folders of their own)")
        return "changed"

    def _run(self) -> dict[str, dict[str, Any]]:
        start = time.monotonic()
        existing = {job.folder: self._recover(job) for job in self.jobs}
        stale = {job.folder: why for job in self.jobs
                 if self._keep(existing[job.folder])
                 and (why := self._stale(job, existing[job.folder]))}
        kept = {f for f, r in existing.items() if self._keep(r) and f not in stale}
        self._announce(existing, kept)
        if stale:
            folder, why = next(iter(stale.items()))
            self.echo(f"{len(stale)} recorded run(s) ran with other settings than this plan gives "
                      f"them ({folder}: {why}): they run again")
        pending = len(self.jobs) - len(kept)
        total = len(self.jobs)
        for i, job in enumerate(self.jobs, 1):
            if job.folder in kept:
                self.records[job.folder] = existing[job.folder]  # type: ignore[assignment]
                self._remember(job, existing[job.folder])  # type: ignore[arg-type]
                continue
            reason = job.skip_reason or self._partner_oom(job) or self._oom_reason(job)
            if reason:
                pending -= 1
                self._skip(job, reason)
                self.echo(f"[{i}/{total}] {job.label}: skipped ({reason})")
                continue
            elapsed = time.monotonic() - start
            left = (f", about {_clock(pending * sum(self.durations) / len(self.durations))} left"
                    if self.durations else "")
            pending -= 1
            self.echo(f"[{i}/{total}] {job.label} (elapsed {_clock(elapsed)}{left})")
            if self.quiet_max_s is not None:
                from parascale.bench.quiet import wait_for_quiet

                self.quiet[job.folder] = wait_for_quiet(self.quiet_max_s, self.echo)
            began = time.monotonic()
            record = self._execute(job)
            self.durations.append(time.monotonic() - began)
            self._remember(job, record)
            self.echo(f"[{i}/{total}] {self._outcome(record, self.durations[-1])}")
        shutil.rmtree(self.study / STAGING, ignore_errors=True)
        return {job.folder: self.records[job.folder] for job in self.jobs}

    def _announce(self, existing: dict[str, Any], kept: set[str]) -> None:
        if kept:
            failed = sum(existing[f]["status"] == "failed" for f in kept)
            note = f"; {failed} failed (--rerun failed runs those again)" if failed else ""
            self.echo(f"{len(kept)} of {len(self.jobs)} runs already done in {self.study} are "
                      "kept (--rerun always runs them again)" + note)
        folders = {job.folder for job in self.jobs}
        others = [p for p in (self.study / RUNS).iterdir() if p.is_dir() and p.name not in folders]
        if others and self.plan_change != "changed":  # a changed plan has said so already
            self.echo(f"note: {self.study / RUNS} also holds {len(others)} run(s) that are not in "
                      "this plan (an earlier study?); the report leaves them out of the tables and "
                      "lists them as not in the plan")

    @staticmethod
    def _outcome(record: dict[str, Any], seconds: float) -> str:
        if record.get("status") != "ok":
            return f"{record.get('status')} after {seconds:.1f} s: {record.get('reason')}"
        summary = record.get("summary") or {}
        machine = record.get("machine") or {}
        busy = (f"; busy machine: {machine.get('other_cores', 0):.2f} other cores"
                if machine.get("busy") is True else "")
        task = record.get("task") if isinstance(record.get("task"), dict) else {}
        rate = (summary.get("steady_throughput") or 0) * (task.get("units_per_sample") or 1)
        return (f"ok in {seconds:.1f} s: steady epoch {summary.get('steady_epoch_time_s', 0):.3f} s, "
                f"{rate:,.0f} {task.get('unit') or 'samples'}/s{judged(record)}{busy}")



def planned_jobs(study: Path) -> list[Job]:
    """The jobs of the plan written in ``study`` (plan.json), as :meth:`StudyRunner.write_plan`
    wrote them: what a job running elsewhere needs to file its run. UsageError without one."""
    try:
        plan = read_plan(Path(study) / PLAN)
    except Refused as exc:
        raise UsageError(f"{study} holds no readable study plan ({PLAN}): {exc}") from None
    keys = ("folder", "config_id", "params", "train", "workers")
    return [Job(r["config_id"], r["folder"], r["params"], r["train"], r["workers"],
                r.get("per_device_batch"), r.get("global_batch"), r.get("scaling"),
                r.get("repeat", 1), bool(r.get("baseline")), r.get("skip_reason"))
            for r in plan["runs"] if isinstance(r, dict) and all(k in r for k in keys)]


def run_study(study: Path, jobs: Sequence[Job], rerun: str = "never",
              echo: Callable[[str], None] = lambda line: None,
              inputs: dict[str, Any] | None = None,
              quiet_max_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Write the plan and run it (see :class:`StudyRunner`); the final record of every job.

    ``quiet_max_s``: wait before each run until the machine is quiet, at most this long."""
    return StudyRunner(Path(study), jobs, rerun, echo, quiet_max_s).run(inputs)


def _flat(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings with the entries of a ``sync_options`` mapping as keys of their own, as
    ``TrainConfig.to_dict`` writes them (records and plans from before held some nested)."""
    nested = settings.get("sync_options")
    flat = {k: v for k, v in settings.items() if k != "sync_options"}
    return {**(nested if isinstance(nested, dict) else {}), **flat}
