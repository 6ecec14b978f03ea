"""``parascale.train(config)``: the one entry point the CLI, studies, searches and users call.

On one machine it starts the workers itself; under torchrun or srun this process *is* a worker
and joins that world. Either way bad input is found here, before any worker starts or anything
is written: names, sizes, data files, whether the model accepts the data, whether the global
batch divides and fits the data set, whether --out can be written, and (for a local launch)
whether the machine has the cores for the workers and threads asked for.

A local run's workers write into a staging folder beside --out; the results replace the previous
ones in --out only when the run has its own (see :mod:`parascale.runtime.staging`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parascale import data, models, sync
from parascale.batch import Plan, make_plan
from parascale.config import TrainConfig, validate
from parascale.runtime.env import available_cores, cores_per_worker
from parascale.errors import UsageError
from parascale.files import check_writable_folder
from parascale.runtime import (check_oversubscription, external_launcher, external_size, launch,
                               open_store, resolve_backend, resolve_device_type)
from parascale.runtime.staging import produce
from parascale.runtime import faults
from parascale import record as rec
from parascale.training.loop import run_worker

__all__ = ["train", "preflight", "world_size_for"]


def world_size_for(cfg: TrainConfig) -> int:
    """Workers this run will have: torchrun's/srun's world, the GPU list, --workers, or cores."""
    if external_launcher():
        return external_size()
    if cfg.gpus:
        return len(cfg.gpus)
    return cfg.workers or available_cores()


def threads_per_worker(cfg: TrainConfig, size: int) -> int:
    """--threads, or the cores shared among the workers (at least one each)."""
    return cfg.threads or cores_per_worker(size)


def preflight(cfg: TrainConfig, size: int, memo: dict | None = None) -> dict[str, Any]:
    """Everything that can be wrong with the input, checked in this process; the derived numbers.

    Each distinct data set is built once in this process and kept for the local workers
    (``data.prepare``). A caller checking many configurations (a study) passes the same
    ``memo`` dict each time: each model is then probed once per input shape, not once per
    configuration.
    """
    validate(cfg)
    faults.check()  # a malformed PARASCALE_FAULT would fail in every worker
    sync.check(cfg.sync)
    models.check(cfg.model)
    with _no_new_folders_on_error(cfg.data_dir if cfg.download else None):
        data.check(cfg)
    device_type = resolve_device_type(cfg.device, cfg.gpus)
    resolve_backend(cfg.backend, device_type)
    if cfg.sync_batchnorm and device_type != "cuda":
        raise UsageError("--sync-batchnorm needs CUDA devices (torch's SyncBatchNorm runs only "
                         "on GPUs); leave it out on CPU workers")
    if cfg.out:
        check_writable_folder(cfg.out)
    memo = {} if memo is None else memo
    # built once per data set in this process, and handed to the local workers (data.handover)
    facts = data.prepare(cfg, keep=not external_launcher())
    num_classes, input_shape = facts["num_classes"], facts["input_shape"]
    plan = make_plan(cfg, size, facts["train"], facts["test"])
    if plan.steps_per_epoch == 0:
        raise UsageError(_batch_too_large(cfg, plan, size))
    if not external_launcher():  # a torchrun or srun world is what it is
        servers = cfg.ps_servers if cfg.sync == "parameter-server" else 0
        check_oversubscription(size, threads_per_worker(cfg, size), available_cores(), servers,
                               insist=cfg.oversubscribe)
    model_key = json.dumps(["model", cfg.model, num_classes, input_shape])
    if model_key not in memo:
        model = models.build(cfg.model, num_classes, input_shape)
        models.probe(model, input_shape, num_classes)
        memo[model_key] = True
    return plan.record_section()


def _batch_too_large(cfg: TrainConfig, plan: Plan, size: int) -> str:
    """Why no step fits the training set, and what would fit, with the numbers."""
    n, name = plan.train_samples, cfg.dataset
    micro = cfg.accumulate
    per_device = plan.derived.per_device_batch
    if cfg.global_batch is not None:
        fits = n // (size * micro) * size * micro
        advice = f"use --global-batch {fits} or less" if fits else \
            f"use at most {n // micro} workers"
        return f"the global batch {cfg.global_batch} is larger than the {n} training samples " \
            f"of {name}; {advice}"
    accumulation = f" x {micro} accumulation steps" if micro > 1 else ""
    options = []
    if n // (per_device * micro):
        options.append(f"at most {n // (per_device * micro)} workers at batch {per_device}")
    if n // (size * micro):
        options.append(f"a batch of at most {n // (size * micro)} per device")
    advice = " or ".join(options) or f"at most {n // micro} workers at batch 1"
    return f"{size} worker{'s' if size != 1 else ''} x batch {per_device}{accumulation} need " \
        f"{plan.derived.global_batch} training samples per step; {name} has {n}: use {advice}"


@contextlib.contextmanager
def _no_new_folders_on_error(path: str | None) -> Iterator[None]:
    """Folders made inside ``path`` (torchvision's, by --download) are removed again when the
    check fails, for instance without a network: a refused run leaves nothing behind."""
    if not path:
        yield
        return
    root = Path(os.path.abspath(os.path.expanduser(path)))
    top = root
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    before = {folder for folder, _, _ in os.walk(top)}
    try:
        yield
    except BaseException:
        for folder, _, _ in os.walk(top, topdown=False):
            if folder not in before:
                with contextlib.suppress(OSError):  # not empty: something was fetched, keep it
                    os.rmdir(folder)
        raise


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
    store = open_store(cfg.port)  # a busy --port is refused before anything is written
    return produce(cfg.out, "parascale-run-",
                   lambda folder: _run_job(cfg, size, derived, store, folder, since),
                   rec.RECORD_NAME, rec.dumps, companions=(rec.MODEL_NAME,))


def _run_job(cfg: TrainConfig, size: int, derived: dict[str, Any], store,
             folder: Path, since: tuple[str, float]) -> dict[str, Any]:
    """Run the workers writing into ``folder``; the record, ``config.out`` as the user gave it."""
    resolved = dataclasses.replace(cfg, workers=size, out=str(folder),
                                   save_model=cfg.save_model and cfg.out is not None)
    print(f"parascale: starting {size} worker{'s' if size > 1 else ''}...", flush=True)
    outcome = launch("parascale.training.worker", size,
                     {"PARASCALE_CONFIG": json.dumps(resolved.to_dict()),
                      **data.handover_env(cfg)},
                     threads=threads_per_worker(cfg, size), store=store)
    if outcome.status == "ok":
        record = json.loads((folder / rec.RECORD_NAME).read_text())
        record["config"]["out"] = cfg.out
        record["timing"] = _timing(record, since)
        return record
    (folder / rec.MODEL_NAME).unlink(missing_ok=True)  # saved before the failure: no result
    return rec.failure_record({**resolved.to_dict(), "out": cfg.out}, outcome.status,
                              outcome.message, derived, detail=outcome.detail)
