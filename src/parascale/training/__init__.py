"""``parascale.train(config)``: the one entry point the CLI, studies, searches and users call.

On one machine it starts the workers itself (:mod:`.launch.launcher`); under torchrun or srun this
process *is* a worker and joins that world. Either way bad input is found first, before any
worker starts or anything is written (:func:`parascale.validation.validate`, then
:mod:`.launch.preflight`), and the step plan made there is the one the workers train on.
"""
from __future__ import annotations

import time
from typing import Any

from parascale.config import TrainConfig, check_run_folder
from parascale.errors import UsageError
from parascale.runtime import external_launcher
from parascale.training.checkpoint import resume
from parascale.training.launch.preflight import (plan_checked, preflight, threads_per_worker,
                                                 world_size_for)
from parascale.validation import validate

__all__ = ["train", "preflight", "world_size_for", "threads_per_worker"]


def train(config: TrainConfig | dict[str, Any], teardown: bool = True,
          command_start: float | None = None) -> dict[str, Any]:
    """Train and return the run record (status ok, failed or oom; never raises for a worker).

    Raises :class:`UsageError` for bad input, before anything is written. Without ``out`` the
    record is returned but nothing is kept on disk. Under torchrun or srun, ``teardown=False``
    leaves the process group standing for a process that exits at once (see ``run_worker``).
    ``command_start`` (a ``time.time()`` value) is when the command began, for the record's
    ``timing``: ``parascale train`` passes its process's start; by default, this call.
    """
    called = time.time()
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(config)
    validate(cfg)
    check_run_folder(cfg)
    size = world_size_for(cfg)
    processes = cfg.processes
    if processes.gpus is None and processes.workers is not None and external_launcher() \
            and processes.workers != size:
        raise UsageError(f"--workers {processes.workers} does not match the {size} processes "
                         f"started by {external_launcher()}; leave --workers out under a "
                         "launcher")
    if processes.device_memory is not None and external_launcher():
        raise UsageError(f"--device-memory caps the workers parascale starts itself, not "
                         f"{external_launcher()}'s; leave it out under a launcher")
    if cfg.checkpoint.max_restarts and external_launcher():
        raise UsageError(f"--max-restarts restarts the workers of parascale's own launch, not "
                         f"{external_launcher()}'s; under torchrun give torchrun --max-restarts "
                         "(parascale continues its restarted workers from the newest checkpoint)")
    plan = plan_checked(cfg, size)  # validated above: checked once, planned once
    if external_launcher():
        from parascale.training.loop.train import run_worker  # torch: after the checks above

        return run_worker(cfg, teardown, plan) or {}
    from parascale.training.launch.launcher import launch_local

    since = ("process start", command_start) if command_start is not None \
        else ("train() call", called)
    said: list[str] = []  # lines said before the log exists, for the log

    def say(line: str) -> None:
        print(line, flush=True)
        said.append(line)

    choice = resume.first_choice(cfg, size, plan.total_steps, say)
    return launch_local(cfg, size, plan, since, choice, said)
