"""``parascale run``'s local launch: N copies of the script as ``train``'s workers are started
(runtime/local.py: the fork server, failure handling, --timeout, SIGTERM), writing into a
staging folder whose record and model replace those in --out only when the run has its own
(runtime/staging.py)."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from parascale import safejson
from parascale import record as rec
from parascale.config import TrainConfig
from parascale.errors import NoSpace, UsageError
from parascale.files import check_writable_folder
from parascale.runtime import contract, launch, open_store
from parascale.runtime.staging import produce
from parascale.training.console import ConsoleLog
from parascale.training.launcher import _timing
from parascale.training.preflight import threads_per_worker

WORKER = "parascale.script.worker"


def checked_script(text: str) -> Path:
    """The script's absolute path; one line when there is no such file or it is no .py."""
    path = Path(text)
    if not path.is_file():
        raise UsageError(f"no such script: {text} (give the path of a Python file, e.g. "
                         "train.py)")
    if path.suffix != ".py":
        raise UsageError(f"{text} is not a Python script (.py); parascale run starts a .py "
                         "file with its arguments")
    return path.resolve()


def checked(given: dict[str, Any]) -> tuple[TrainConfig, int]:
    """The run's configuration and world size, after every check that needs no worker (one
    line for the first thing wrong): ``parascale run``'s, and a study's over a script."""
    from parascale.runtime import check_oversubscription, external_launcher
    from parascale.runtime import resolve_backend, resolve_device_type
    from parascale.runtime.env import available_cores, speaks
    from parascale.script.api import refusal
    from parascale.training.preflight import world_size_for
    from parascale.validation import validate

    cfg = TrainConfig.from_dict(given)
    validate(cfg)
    if (why := refusal(cfg.sync)) is not None:
        raise UsageError(why)
    resolve_backend(cfg.backend, resolve_device_type(cfg.device, cfg.gpus))  # --gpus, no CUDA
    if cfg.out and speaks():
        check_writable_folder(cfg.out)
    if cfg.tensorboard and speaks():  # rank 0 writes the series
        check_writable_folder(cfg.tensorboard, "--tensorboard")
    size = world_size_for(cfg)
    launcher = external_launcher()
    if launcher and cfg.gpus is None and cfg.workers is not None and cfg.workers != size:
        raise UsageError(f"--workers {cfg.workers} does not match the {size} processes "
                         f"started by {launcher}; leave --workers out under a launcher")
    if not launcher:
        check_oversubscription(size, threads_per_worker(cfg, size), available_cores(),
                               insist=cfg.oversubscribe)
    return cfg, size


def run(config: dict[str, Any], script: str | Path, argv: list[str]) -> dict[str, Any]:
    """``parascale run`` from Python, on this machine: the record (status ok, failed or oom;
    never raises for a worker), or :class:`UsageError` before anything starts."""
    since = ("run() call", time.time())
    cfg, size = checked(config)
    return launch_script(cfg, size, checked_script(str(script)), list(argv), since)


def launch_script(cfg: TrainConfig, size: int, script: Path, argv: list[str],
                  since: tuple[str, float]) -> dict[str, Any]:
    """Run ``size`` copies of ``script`` and return rank 0's record (or a failure record)."""
    store = open_store(cfg.port)  # a busy --port is refused before anything is written
    return produce(cfg.out, "parascale-run-",
                   lambda folder: _job(cfg, size, script, argv, store, folder, since),
                   rec.RECORD_NAME, rec.dumps, companions=(rec.MODEL_NAME, rec.LOG_NAME))


def spec(cfg: TrainConfig, script: Path, argv: list[str]) -> str:
    """What each copy is told (``contract.SCRIPT``)."""
    return safejson.dumps({"path": str(script), "argv": argv, "config": cfg.to_dict()})


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
