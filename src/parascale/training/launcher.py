"""``train``'s local launch: its workers on this machine, the run's console log, restarts and
the record.

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
import dataclasses
import datetime
import json
import shutil
import time
from pathlib import Path
from typing import Any

from parascale import data, safejson
from parascale import record as rec
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.errors import NoSpace
from parascale.runtime import contract, launch, open_store
from parascale.runtime.staging import produce
from parascale.training import checkpoint, resume
from parascale.training.console import ConsoleLog
from parascale.training.preflight import threads_per_worker

__all__ = ["launch_local"]


def _timing(record: dict[str, Any], since: tuple[str, float]) -> dict[str, Any]:
    """The command's own times around the workers' training window (docs/record.md)."""
    timing = record["timing"]  # what rank 0 knew: its first step and training time
    label, start = since
    command = time.time() - start
    startup = timing["first_step_at"] - start
    return {"command_s": command, "startup_s": startup, "training_s": timing["training_s"],
            "finish_s": command - startup - timing["training_s"],
            "first_step_at": timing["first_step_at"], "since": label}


def launch_local(cfg: TrainConfig, size: int, plan: Plan, since: tuple[str, float],
                 choice: resume.Choice | None = None,
                 said: list[str] | None = None) -> dict[str, Any]:
    """Run ``size`` local workers on ``plan`` and return the record; the results replace
    those in --out only when the run has its own (:func:`parascale.runtime.staging.produce`)."""
    store = open_store(cfg.port)  # a busy --port is refused before anything is written
    return produce(cfg.out, "parascale-run-",
                   lambda folder: _run_job(cfg, size, plan, store, folder, since, choice,
                                           said or []),
                   rec.RECORD_NAME, rec.dumps,
                   companions=(rec.MODEL_NAME, rec.LOG_NAME, rec.TRACES_NAME))


def _open_log(cfg: TrainConfig, folder: Path) -> ConsoleLog | None:
    """The run's console log: beside the checkpoints while the run is unfinished when it keeps
    any (so that it outlasts a failure or an interruption, and a resumed run goes on writing
    it), else in the staging folder; nothing without --out (nothing is kept)."""
    if not cfg.out:
        return None
    if resume.checkpointing(cfg):
        return ConsoleLog(checkpoint.folder_of(cfg.out) / checkpoint.LOG_NAME,
                          fresh=not cfg.resume)
    return ConsoleLog(folder / rec.LOG_NAME, fresh=True)


def _run_job(cfg: TrainConfig, size: int, plan: Plan, store, folder: Path,
             since: tuple[str, float], choice: resume.Choice | None,
             said: list[str]) -> dict[str, Any]:
    """Run the workers writing into ``folder`` (again from the newest checkpoint after a
    failure, up to --max-restarts times); the record, ``config.out`` as the user gave it."""
    derived = plan.record_section()
    resolved = dataclasses.replace(cfg, workers=size, out=str(folder),
                                   save_model=cfg.save_model and cfg.out is not None)
    log = _open_log(cfg, folder)
    checkpoints = checkpoint.folder_of(cfg.out) if cfg.out else None
    restarts: list[dict[str, Any]] = []

    def next_attempt(attempt: int, failed) -> dict[str, str]:
        chosen = resume.choose(cfg, size, derived["total_steps"], "restart", rank=failed.rank,
                               reason=failed.message) if resume.checkpointing(cfg) else None
        restarts.append({"at": _iso(failed.ended_at), "attempt": attempt, "rank": failed.rank,
                         "reason": failed.message, "from_step": chosen and chosen.step,
                         "checkpoint": chosen and chosen.label})
        print(f"parascale: {failed.message}; restarting every worker from "
              f"{chosen.label if chosen else 'the beginning'} (restart {attempt} of "
              f"{cfg.max_restarts})", flush=True)
        return {contract.RESUME: chosen.to_env() if chosen else ""}

    env = {contract.CONFIG: safejson.dumps(resolved.to_dict()),
           contract.PLAN: safejson.dumps(plan.to_dict()),
           **(data.handover_env(cfg) if cfg.task is None else {}),
           contract.CHECKPOINTS: str(checkpoints or ""),
           contract.LOG: str(log.path) if log else "",
           contract.RESUME: choice.to_env() if choice else ""}
    try:
        with log.tee() if log else contextlib.nullcontext():
            if log:
                log.line(f"--- parascale train, local launch of {size} worker(s), "
                         f"{rec.now()} ---")
                for line in said:
                    log.line(line)
            print(f"parascale: starting {size} worker{'s' if size > 1 else ''}...", flush=True)
            outcome = launch("parascale.training.worker", size, env,
                             threads=threads_per_worker(cfg, size), store=store,
                             max_restarts=cfg.max_restarts, restart=next_attempt)
    except BaseException:  # interrupted: the log said so, and stays where it is
        if log:
            log.close()
        raise
    if outcome.status == "ok":
        record = json.loads((folder / rec.RECORD_NAME).read_text())
        record["config"]["out"] = cfg.out
        record["timing"] = _timing(record, since)
        record["restarts"] = restarts
    else:
        (folder / rec.MODEL_NAME).unlink(missing_ok=True)  # saved before the failure: no result
        record = rec.failure_record({**resolved.to_dict(), "out": cfg.out}, outcome.status,
                                    outcome.message, derived, detail=outcome.detail)
        record["restarts"] = restarts
        record["resumed"] = [choice.entry()] if choice else None
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
