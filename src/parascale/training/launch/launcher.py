"""The local launch of a training job, the one for ``train``'s workers and ``parascale run``'s
copies of a script: its workers on this machine, the run's console log, restarts and the record.

The workers write into a staging folder beside --out; the results replace the previous ones in
--out only when the run has its own (see :mod:`parascale.runtime.staging`): the record, the
model and the console log (``log.txt``). Checkpoints are not results: they live in
``--out/checkpoints`` from the moment they are written, beside the unfinished run's log, so
that they outlast a failure, a restart and the launcher itself (docs/checkpoints.md). What a
worker is told travels in the variables of :mod:`parascale.runtime.contract`: the resolved
configuration and the plan the launcher made, among others.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parascale import data, runrecord, safejson
from parascale import record as rec
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.errors import NoSpace
from parascale.runtime import contract, launch, memory_cap, open_store
from parascale.runtime.staging import produce
from parascale.tasks import recorded_config
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint import resume
from parascale.training.launch.preflight import threads_per_worker
from parascale.training.observe.console import ConsoleLog

__all__ = ["Job", "launch_job", "launch_local"]


@dataclass
class Job:
    """What one local launch runs: ``train``'s workers, or N copies of a user's script
    (``parascale run``, script/launch.py). Everything else (the staging of --out, the console
    log, restarts, the record of a failure, the command's timing) is the same for both."""

    cfg: TrainConfig  # as given: ``out`` is the user's --out
    size: int
    worker: str  # the module each worker runs
    env: Callable[[TrainConfig], dict[str, str]]  # what each worker is told, from the
    # configuration resolved for the launch (its workers, and the staging folder as out)
    heading: str  # the command, as the log's first line names it
    starting: str  # what starts, as the terminal is told: '2 workers', '2 copies of a.py'
    plan: Plan | None = None  # the step plan: a failure record's derived section
    choice: resume.Choice | None = None  # the checkpoint the first attempt continues from
    said: list[str] = field(default_factory=list)  # lines said before the log existed
    companions: tuple[str, ...] = (rec.MODEL_NAME, rec.LOG_NAME, rec.TRACES_NAME)
    script: dict[str, Any] | None = None  # a failure record's ``script`` section

    @property
    def memory_cap(self) -> int | None:
        """Each worker's memory cap in bytes (``--device-memory``), or None: the launch gives
        every worker a memory cgroup of its own (:mod:`parascale.runtime.memory_cap`)."""
        given = self.cfg.processes.device_memory
        return None if given is None else memory_cap.parse_size(given)


def launch_job(job: Job, since: tuple[str, float]) -> dict[str, Any]:
    """Run ``job``'s workers and return the record (status ok, failed or oom); the results
    replace those in --out only when the run has its own
    (:func:`parascale.runtime.staging.produce`). ``since``: what the command's timing counts
    from (a label and a ``time.time()``)."""
    store = open_store(job.cfg.processes.port)  # a busy --port: refused before anything is written
    return produce(job.cfg.output.out, "parascale-run-",
                   lambda folder: _run_job(job, store, folder, since), rec.RECORD_NAME,
                   rec.dumps, companions=job.companions)


def launch_local(cfg: TrainConfig, size: int, plan: Plan, since: tuple[str, float],
                 choice: resume.Choice | None = None,
                 said: list[str] | None = None) -> dict[str, Any]:
    """``train``'s local launch: ``size`` workers on ``plan`` (see :func:`launch_job`)."""
    checkpoints = checkpoint.folder_of(cfg.output.out) if cfg.output.out else None

    def env(resolved: TrainConfig) -> dict[str, str]:
        return {contract.CONFIG: safejson.dumps(resolved.to_dict()),
                contract.PLAN: safejson.dumps(plan.to_dict()),
                **(data.handover_env(cfg) if cfg.job.task is None else {}),
                contract.CHECKPOINTS: str(checkpoints or ""),
                contract.RESUME: choice.to_env() if choice else ""}

    return launch_job(Job(cfg, size, "parascale.training.launch.worker", env, "parascale train",
                          f"{size} worker{'s' if size > 1 else ''}", plan, choice,
                          list(said or [])), since)


def _open_log(cfg: TrainConfig, folder: Path) -> ConsoleLog | None:
    """The run's console log: beside the checkpoints while the run is unfinished when it keeps
    any (so that it outlasts a failure or an interruption, and a resumed run goes on writing
    it), else in the staging folder; nothing without --out (nothing is kept)."""
    if not cfg.output.out:
        return None
    if resume.checkpointing(cfg):
        return ConsoleLog(checkpoint.folder_of(cfg.output.out) / checkpoint.LOG_NAME,
                          fresh=not cfg.checkpoint.resume)
    return ConsoleLog(folder / rec.LOG_NAME, fresh=True)


def _run_job(job: Job, store, folder: Path, since: tuple[str, float]) -> dict[str, Any]:
    """Run the workers writing into ``folder`` (again from the newest checkpoint after a
    failure, up to --max-restarts times); the record, ``config.out`` as the user gave it."""
    cfg, size = job.cfg, job.size
    resolved = cfg.replace(workers=size, out=str(folder),
                           save_model=cfg.output.save_model and cfg.output.out is not None)
    log = _open_log(cfg, folder)
    restarts: list[dict[str, Any]] = []

    def next_attempt(attempt: int, failed) -> dict[str, str]:
        total = job.plan.total_steps if job.plan else 0
        chosen = resume.choose(cfg, size, total, "restart", rank=failed.rank,
                               reason=failed.message) if resume.checkpointing(cfg) else None
        restarts.append({"at": _iso(failed.ended_at), "attempt": attempt, "rank": failed.rank,
                         "reason": failed.message, "from_step": chosen and chosen.step,
                         "checkpoint": chosen and chosen.label})
        print(f"parascale: {failed.message}; restarting every worker from "
              f"{chosen.label if chosen else 'the beginning'} (restart {attempt} of "
              f"{cfg.checkpoint.max_restarts})", flush=True)
        return {contract.RESUME: chosen.to_env() if chosen else ""}

    env = {**job.env(resolved), contract.LOG: str(log.path) if log else ""}
    try:
        with log.tee() if log else contextlib.nullcontext():
            if log:
                log.line(f"--- {job.heading}, local launch of {size} worker(s), "
                         f"{rec.now()} ---")
                for line in job.said:
                    log.line(line)
            print(f"parascale: starting {job.starting}...", flush=True)
            outcome = launch(job.worker, size, env, threads=threads_per_worker(cfg, size),
                             store=store, max_restarts=cfg.checkpoint.max_restarts,
                             restart=next_attempt, cap=job.memory_cap)
    except BaseException:  # interrupted: the log said so, and stays where it is
        if log:
            log.close()
        raise
    written = folder / rec.RECORD_NAME
    if outcome.status == "ok" and written.exists():
        record = runrecord.launched(json.loads(written.read_text()), out=cfg.output.out,
                                    since=since, restarts=restarts)
    else:
        (folder / rec.MODEL_NAME).unlink(missing_ok=True)  # saved before the failure: no result
        record = runrecord.failed(
            {**recorded_config(resolved), "out": cfg.output.out}, outcome.status, outcome.message,
            job.plan.record_section() if job.plan else None, detail=outcome.detail,
            restarts=restarts, resumed=[job.choice.entry()] if job.choice else None,
            script=job.script).to_dict()
    if log:
        ending = {"ok": "finished", "failed": "failed", "oom": "ran out of memory"}
        after = f" after {len(restarts)} restart(s)" if restarts else ""
        log.line(f"parascale: {ending.get(outcome.status, outcome.status)} at {rec.now()}"
                 f"{after}" + ("" if outcome.status == "ok" else f": {outcome.message}"))
        log.close()
    if outcome.no_space:  # a full disk is no result of training: the previous set stays
        raise NoSpace(outcome.message)
    if log and log.path != folder / rec.LOG_NAME:  # the result set gets the whole log so far
        shutil.copyfile(log.path, folder / rec.LOG_NAME)
    return record


def _iso(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.timezone.utc) \
        .isoformat(timespec="seconds")
