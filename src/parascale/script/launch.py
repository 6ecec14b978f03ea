"""``parascale run``'s checks and launch: N copies of the script, started by ``train``'s own
local launch (training/launch/launcher.py: the fork server, failure handling, --timeout,
SIGTERM, the staging of --out, the console log and the record of a failure)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from parascale import safejson
from parascale import record as rec
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.files import check_writable_folder
from parascale.runtime import contract
from parascale.training.launch.launcher import Job, launch_job
from parascale.training.launch.preflight import threads_per_worker

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
    from parascale.script.options import refusal
    from parascale.training.launch.preflight import world_size_for
    from parascale.validation import validate

    cfg = TrainConfig.from_dict(given)
    validate(cfg)
    if (why := refusal(cfg.strategy.sync)) is not None:
        raise UsageError(why)
    processes = cfg.processes
    resolve_backend(processes.backend,  # --gpus without CUDA
                    resolve_device_type(processes.device, processes.gpus))
    if cfg.output.out and speaks():
        check_writable_folder(cfg.output.out)
    if cfg.output.tensorboard and speaks():  # rank 0 writes the series
        check_writable_folder(cfg.output.tensorboard, "--tensorboard")
    size = world_size_for(cfg)
    launcher = external_launcher()
    if launcher and processes.gpus is None and processes.workers is not None \
            and processes.workers != size:
        raise UsageError(f"--workers {processes.workers} does not match the {size} processes "
                         f"started by {launcher}; leave --workers out under a launcher")
    if not launcher:
        check_oversubscription(size, threads_per_worker(cfg, size), available_cores(),
                               insist=processes.oversubscribe)
    return cfg, size


def run(config: dict[str, Any], script: str | Path, argv: list[str]) -> dict[str, Any]:
    """``parascale run`` from Python, on this machine: the record (status ok, failed or oom;
    never raises for a worker), or :class:`UsageError` before anything starts."""
    since = ("run() call", time.time())
    cfg, size = checked(config)
    return launch_script(cfg, size, checked_script(str(script)), list(argv), since)


def launch_script(cfg: TrainConfig, size: int, script: Path, argv: list[str],
                  since: tuple[str, float]) -> dict[str, Any]:
    """Run ``size`` copies of ``script`` and return rank 0's record (or a failure record):
    ``train``'s local launch (:func:`parascale.training.launch.launcher.launch_job`), each worker
    running the script."""
    job = Job(cfg, size, WORKER, lambda resolved: {contract.SCRIPT: spec(resolved, script, argv)},
              f"parascale run {script.name} {' '.join(argv)}",
              f"{size} cop{'ies' if size > 1 else 'y'} of {script.name}",
              companions=(rec.MODEL_NAME, rec.LOG_NAME),
              script={"path": script.name, "args": argv})
    return launch_job(job, since)


def spec(cfg: TrainConfig, script: Path, argv: list[str]) -> str:
    """What each copy is told (``contract.SCRIPT``)."""
    return safejson.dumps({"path": str(script), "argv": argv, "config": cfg.to_dict()})
