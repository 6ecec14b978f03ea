"""The launcher's checks, before any worker starts or anything is written: names, sizes, data
files, whether the model accepts the data, whether the global batch divides and fits the data
set, whether --out can be written, and (for a local launch) whether the machine has the cores
for the workers, threads and the strategy's helper processes asked for. What they compute, the
step plan, is made here once and handed to the workers.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parascale import data, models, sync, tasks
from parascale.batch import Plan, derive, make_plan
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.files import check_writable_folder
from parascale.runtime import (check_oversubscription, external_launcher, external_size,
                               faults, resolve_backend, resolve_device_type)
from parascale.runtime.env import available_cores, cores_per_worker
from parascale.training.checkpoint import resume
from parascale.validation import validate

__all__ = ["plan_checked", "preflight", "threads_per_worker", "world_size_for"]


def world_size_for(cfg: TrainConfig) -> int:
    """Workers this run will have: torchrun's/srun's world, the GPU list, --workers, or cores."""
    if external_launcher():
        return external_size()
    if cfg.processes.gpus:
        return len(cfg.processes.gpus)
    return cfg.processes.workers or available_cores()


def threads_per_worker(cfg: TrainConfig, size: int) -> int:
    """--threads, or the cores shared among the workers (at least one each)."""
    return cfg.processes.threads or cores_per_worker(size)


def preflight(cfg: TrainConfig, size: int, memo: dict | None = None) -> dict[str, Any]:
    """Everything that can be wrong with the input, checked in this process; the derived numbers.

    Each distinct data set is built once in this process and kept for the local workers
    (``data.prepare``). A caller checking many configurations (a study) passes the same
    ``memo`` dict each time: each model is then probed once per input shape, not once per
    configuration.
    """
    validate(cfg)
    return plan_checked(cfg, size, memo).record_section()


def plan_checked(cfg: TrainConfig, size: int, memo: dict | None = None) -> Plan:
    """:func:`preflight` of a configuration that :func:`parascale.validation.validate` has
    passed already (``train`` validates it first; a study, as it plans): the step plan, which
    the launcher then hands to its workers rather than have each make it again."""
    faults.check()  # a malformed PARASCALE_FAULT would fail in every worker
    sync.check(cfg.strategy.sync)
    if cfg.job.task is None:  # the built-in family: the registries' model and data
        models.check(cfg.job.model)
        with _no_new_folders_on_error(cfg.data.data_dir if cfg.data.download else None):
            data.check(cfg)
        tasks.check_target(cfg)
    device_type = resolve_device_type(cfg.processes.device, cfg.processes.gpus)
    resolve_backend(cfg.processes.backend, device_type)
    if cfg.strategy.sync_batchnorm and device_type != "cuda":
        raise UsageError("--sync-batchnorm needs CUDA devices (torch's SyncBatchNorm runs only "
                         "on GPUs); leave it out on CPU workers")
    if cfg.output.tensorboard:
        check_writable_folder(cfg.output.tensorboard, "--tensorboard")
    if cfg.output.out:
        check_writable_folder(cfg.output.out)
        resume.check_folder(cfg)
        resume.refuse_fresh_start(cfg)
    memo = {} if memo is None else memo
    strategy = sync.strategy_of(cfg)
    replicas = strategy.replicas_per_device(cfg)
    derive(cfg, size, replicas=replicas)  # a batch that does not divide, before the data is read
    # built once per data set in this process, and handed to the local workers (data.handover)
    facts = data.prepare(cfg, keep=not external_launcher()) if cfg.job.task is None \
        else _user_task(cfg, size, memo)
    plan = make_plan(cfg, size, facts["train"], facts["test"], replicas=replicas)
    if plan.steps_per_epoch == 0:
        raise UsageError(_batch_too_large(cfg, plan, size))
    if not external_launcher():  # a torchrun or srun world is what it is
        check_oversubscription(size, threads_per_worker(cfg, size), available_cores(),
                               strategy.helper_processes(cfg), insist=cfg.processes.oversubscribe)
    if cfg.job.task is not None:  # its model was built and tried with its data in _user_task
        return plan
    num_classes, input_shape = facts["num_classes"], facts["input_shape"]
    sizes = models.options(cfg)
    model_key = json.dumps(["model", cfg.job.model, num_classes, input_shape, sizes,
                            cfg.strategy.sync, size > 1])
    if model_key not in memo:
        model = models.build(cfg.job.model, num_classes, input_shape, **sizes)
        models.probe(model, input_shape, num_classes)
        memo[model_key] = model_refusal(cfg, model, size)
    if memo[model_key]:
        raise UsageError(memo[model_key])
    return plan


def model_refusal(cfg: TrainConfig, model, size: int) -> str | None:
    """Why the run's strategy cannot train ``model`` on ``size`` workers (FSDP cannot shard
    it), or None: said here, before any worker starts, not by every worker."""
    return sync.strategy_of(cfg).refuse_model(cfg, model, size)


def _user_task(cfg: TrainConfig, size: int, memo: dict) -> dict[str, Any]:
    """A user's task loaded, checked and tried on two samples, once per configuration of the
    things it depends on (a study checks many configurations of one task)."""
    key = json.dumps(["task", cfg.job.task, cfg.job.seed, cfg.data.val_fraction,
                      cfg.evaluation.target_metric, cfg.evaluation.target_accuracy,
                      cfg.strategy.sync, size > 1])
    if key not in memo:
        memo[key] = tasks.preflight(cfg, size)
    return memo[key]


def _batch_too_large(cfg: TrainConfig, plan: Plan, size: int) -> str:
    """Why no step fits the training set, and what would fit, with the numbers."""
    n, name = plan.train_samples, cfg.job.task or cfg.data.dataset
    micro = cfg.batch.accumulate
    per_device = plan.derived.per_device_batch
    if cfg.batch.global_batch is not None:
        fits = n // (size * micro) * size * micro
        advice = f"use --global-batch {fits} or less" if fits else \
            f"use at most {n // micro} workers"
        return f"the global batch {cfg.batch.global_batch} is larger than the {n} training " \
            f"samples of {name}; {advice}"
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
