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
from pathlib import Path
from typing import Any

from parascale import data, models, sync
from parascale.config import TrainConfig, available_cores, validate
from parascale.errors import UsageError
from parascale.runtime import (external_launcher, external_size, launch, resolve_backend,
                               resolve_device_type)
from parascale.runtime import faults
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


def preflight(cfg: TrainConfig, size: int) -> dict[str, Any]:
    """Everything that can be wrong with the input, checked in this process; the derived numbers."""
    validate(cfg)
    faults.check()  # a malformed PARASCALE_FAULT would fail in every worker
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
    bundle = data.build(cfg)
    plan = make_plan(cfg, size, len(bundle.train), len(bundle.test))
    if plan.steps_per_epoch == 0:
        raise UsageError(f"the global batch {plan.derived.global_batch} is larger than the "
                         f"{len(bundle.train)} training samples of {cfg.dataset}; use a batch of "
                         f"at most {len(bundle.train) // size} per device")
    model = models.build(cfg.model, bundle.num_classes, bundle.input_shape)
    models.probe(model, bundle.input_shape, bundle.num_classes)
    return plan.record_section()


def train(config: TrainConfig | dict[str, Any], teardown: bool = True) -> dict[str, Any]:
    """Train and return the run record (status ok, failed or oom; never raises for a worker).

    Raises :class:`UsageError` for bad input, before anything is written. Without ``out`` the
    record is returned but nothing is kept on disk. Under torchrun or srun, ``teardown=False``
    leaves the process group standing for a process that exits at once (see ``run_worker``).
    """
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
    return _launch_local(cfg, size, derived)


def _launch_local(cfg: TrainConfig, size: int, derived: dict[str, Any]) -> dict[str, Any]:
    scratch = None if cfg.out else tempfile.mkdtemp(prefix="parascale-run-")
    out = Path(cfg.out or scratch)
    resolved = dataclasses.replace(cfg, workers=size, out=str(out),
                                   save_model=cfg.save_model and scratch is None)
    threads = cfg.threads or max(1, available_cores() // size)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a record left by an earlier run here must not pass for this one's if it is interrupted
        (out / rec.RECORD_NAME).unlink(missing_ok=True)
        outcome = launch("parascale.training.worker", size,
                         {"PARASCALE_CONFIG": json.dumps(resolved.to_dict())},
                         port=cfg.port, threads=threads)
        if outcome.status == "ok":
            return json.loads((out / rec.RECORD_NAME).read_text())
        record = rec.failure_record(resolved.to_dict(), outcome.status, outcome.message,
                                    derived, detail=outcome.detail)
        if scratch is None:
            rec.write(out, record)
        return record
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
