"""``parascale run``'s local launch: N copies of the script as ``train``'s workers are started
(runtime/local.py: the fork server, failure handling, --timeout, SIGTERM), writing into a
staging folder whose record and model replace those in --out only when the run has its own
(runtime/staging.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from parascale import record as rec
from parascale.config import TrainConfig
from parascale.errors import NoSpace
from parascale.runtime import contract, launch, open_store
from parascale.runtime.staging import produce
from parascale.training.console import ConsoleLog
from parascale.training.launcher import _timing
from parascale.training.preflight import threads_per_worker

WORKER = "parascale.script.worker"


def launch_script(cfg: TrainConfig, size: int, script: Path, argv: list[str],
                  since: tuple[str, float]) -> dict[str, Any]:
    """Run ``size`` copies of ``script`` and return rank 0's record (or a failure record)."""
    store = open_store(cfg.port)  # a busy --port is refused before anything is written
    return produce(cfg.out, "parascale-run-",
                   lambda folder: _job(cfg, size, script, argv, store, folder, since),
                   rec.RECORD_NAME, rec.dumps, companions=(rec.MODEL_NAME, rec.LOG_NAME))


def spec(cfg: TrainConfig, script: Path, argv: list[str]) -> str:
    """What each copy is told (``contract.SCRIPT``)."""
    return json.dumps({"path": str(script), "argv": argv, "config": cfg.to_dict()})


def _job(cfg: TrainConfig, size: int, script: Path, argv: list[str], store, folder: Path,
         since: tuple[str, float]) -> dict[str, Any]:
    resolved = dataclasses.replace(cfg, workers=size, out=str(folder))
    # the run's console, as train keeps it: the launcher's lines and rank 0's (running.py)
    log = ConsoleLog(folder / rec.LOG_NAME, fresh=True)
    env = {contract.SCRIPT: spec(resolved, script, argv), contract.LOG: str(log.path)}
    try:
        with log.tee():
            log.line(f"--- parascale run {script.name} {' '.join(argv)}, local launch of "
                     f"{size} worker(s), {rec.now()} ---")
            print(f"parascale: starting {size} cop{'ies' if size > 1 else 'y'} of "
                  f"{script.name}...", flush=True)
            outcome = launch(WORKER, size, env, threads=threads_per_worker(cfg, size),
                             store=store)
        log.line(f"parascale: {'finished' if outcome.status == 'ok' else outcome.status} at "
                 f"{rec.now()}" + ("" if outcome.status == "ok" else f": {outcome.message}"))
    finally:
        log.close()
    if outcome.no_space:
        raise NoSpace(outcome.message)
    written = folder / rec.RECORD_NAME
    if outcome.status == "ok" and written.exists():
        record = json.loads(written.read_text())
        record["config"]["out"] = cfg.out
        record["timing"] = _timing(record, since)
        return record
    (folder / rec.MODEL_NAME).unlink(missing_ok=True)
    config = {**resolved.to_dict(), "out": cfg.out}
    record = rec.failure_record(config, outcome.status, outcome.message, None,
                                detail=outcome.detail)
    record["script"] = {"path": script.name, "args": argv}
    return record
