"""``parascale.train(config)``: the one entry point the CLI, studies, searches and users call.

On one machine it starts the workers itself; under torchrun or srun this process *is* a worker
and joins that world. Either way bad input is found here, before any worker starts or anything
is written: names, sizes, data files, whether the model accepts the data, whether the global
batch divides and fits the data set.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from parascale import data, models, sync
from parascale.config import TrainConfig, available_cores, validate
from parascale.errors import UsageError
from parascale.runtime import (external_launcher, external_size, launch, resolve_backend,
                               resolve_device_type)
from parascale.training import record as rec
from parascale.training.loop import make_plan, run_worker

__all__ = ["train", "preflight", "world_size_for"]


def world_size_for(cfg: TrainConfig) -> int:
    """Workers this run will have: torchrun's/srun's world, the GPU list, --workers, or cores."""
    if external_launcher():
        return external_size()
    if cfg.gpus:
        return len(cfg.gpus)
    return cfg.workers or available_cores()


def preflight(cfg: TrainConfig, size: int, memo: dict | None = None) -> dict[str, Any]:
    """Everything that can be wrong with the input, checked in this process; the derived numbers.

    A caller checking many configurations (a study) passes the same ``memo`` dict each time:
    each distinct data set is then built once, and each model probed once per input shape,
    instead of once per configuration (building digits alone takes about 50 ms).
    """
    validate(cfg)
    sync.check(cfg.sync)
    models.check(cfg.model)
    data.check(cfg)
    device_type = resolve_device_type(cfg.device, cfg.gpus)
    resolve_backend(cfg.backend, device_type)
    if cfg.sync_batchnorm and device_type != "cuda":
        raise UsageError("--sync-batchnorm needs CUDA devices (torch's SyncBatchNorm runs only "
                         "on GPUs); leave it out on CPU workers")
    if cfg.out and Path(cfg.out).exists() and not Path(cfg.out).is_dir():
        raise UsageError(f"--out {cfg.out} exists and is not a folder")
    memo = {} if memo is None else memo
    data_key = json.dumps(["data", *(getattr(cfg, name) for name in data.FIELDS)], default=str)
    if data_key not in memo:
        bundle = data.build(cfg)
        memo[data_key] = (len(bundle.train), len(bundle.test), bundle.num_classes,
                          tuple(bundle.input_shape))
    n_train, n_test, num_classes, input_shape = memo[data_key]
    plan = make_plan(cfg, size, n_train, n_test)
    if plan.steps_per_epoch == 0:
        raise UsageError(f"the global batch {plan.derived.global_batch} is larger than the "
                         f"{n_train} training samples of {cfg.dataset}; use a batch of "
                         f"at most {n_train // size} per device")
    model_key = json.dumps(["model", cfg.model, num_classes, input_shape])
    if model_key not in memo:
        model = models.build(cfg.model, num_classes, input_shape)
        models.probe(model, input_shape, num_classes)
        memo[model_key] = True
    return plan.record_section()


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
    size = world_size_for(cfg)
    if cfg.gpus is None and cfg.workers is not None and external_launcher() \
            and cfg.workers != size:
        raise UsageError(f"--workers {cfg.workers} does not match the {size} processes started "
                         f"by {external_launcher()}; leave --workers out under a launcher")
    derived = preflight(cfg, size)
    if external_launcher():
        return run_worker(cfg, teardown) or {}
    since = ("process start", command_start) if command_start is not None \
        else ("train() call", called)
    return _launch_local(cfg, size, derived, since)


def _timing(record: dict[str, Any], since: tuple[str, float]) -> dict[str, Any]:
    """The command's own times around the workers' training window (docs/record.md)."""
    timing = record["timing"]  # what rank 0 knew: its first step and training time
    label, start = since
    command = time.time() - start
    startup = timing["first_step_at"] - start
    return {"command_s": command, "startup_s": startup, "training_s": timing["training_s"],
            "finish_s": command - startup - timing["training_s"],
            "first_step_at": timing["first_step_at"], "since": label}


def _launch_local(cfg: TrainConfig, size: int, derived: dict[str, Any],
                  since: tuple[str, float]) -> dict[str, Any]:
    scratch = None if cfg.out else tempfile.mkdtemp(prefix="parascale-run-")
    out = Path(cfg.out or scratch)
    resolved = dataclasses.replace(cfg, workers=size, out=str(out),
                                   save_model=cfg.save_model and scratch is None)
    threads = cfg.threads or max(1, available_cores() // size)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a record left by an earlier run here must not pass for this one's if it is interrupted
        (out / rec.RECORD_NAME).unlink(missing_ok=True)
        print(f"parascale: starting {size} worker{'s' if size > 1 else ''}...", flush=True)
        outcome = launch("parascale.training.worker", size,
                         {"PARASCALE_CONFIG": json.dumps(resolved.to_dict())},
                         port=cfg.port, threads=threads)
        if outcome.status == "ok":
            record = json.loads((out / rec.RECORD_NAME).read_text())
            record["timing"] = _timing(record, since)
            if scratch is None:
                rec.write(out, record)
            return record
        record = rec.failure_record(resolved.to_dict(), outcome.status, outcome.message,
                                    derived)
        if scratch is None:
            rec.write(out, record)
        return record
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
