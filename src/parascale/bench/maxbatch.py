"""``batch_size: max`` in a study (the flag, ``-P`` or the study file): the largest per-device
batch that fits, found by the batch search for each model and data set of the plan.

The plan is made first with a stand-in batch (every check that does not depend on the batch
still runs on every configuration), then the search runs once per distinct model, data set and
device, and each configuration gets its model's batch: the BSC study compares ResNet50V2 and
ResNet152V2, each at its own largest batch. A dry run searches nothing and shows ``max``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parascale import sync
from parascale.batch import derive
from parascale.config import TrainConfig
from parascale.errors import UsageError

MAX = "max"
STAND_IN = 1  # fits every data set: the batch-dependent checks wait for the real batch
#: what decides a model's largest batch (the search's own inputs)
SEARCH_FIELDS = ("model", "dataset", "data_dir", "image_size", "download", "task", "seed",
                 "val_fraction")


def take(parameters: dict[str, Any] | None, options: dict[str, Any],
         assignments: list[tuple[str, Any]]) -> bool:
    """Replace every ``batch_size`` of ``max`` with the stand-in; whether there was one."""
    found = False
    for where in (parameters or {}), options:
        if where.get("batch_size") == MAX:
            where["batch_size"], found = STAND_IN, True
    for i, (name, value) in enumerate(assignments):
        if name == "batch_size" and value == MAX:
            assignments[i], found = (name, STAND_IN), True
    return found


def _key(train: dict[str, Any]) -> tuple:
    gpus = train.get("gpus")
    return tuple(str(train.get(f)) for f in SEARCH_FIELDS) + (gpus[0] if gpus else None,)


def resolve(jobs: list, dry_run: bool, search: Callable[[dict[str, Any]], int],
            echo: Callable[[str], None]) -> None:
    """Give every job its model's largest batch (or, in a dry run, show ``max``)."""
    for job in jobs:
        if job.scaling == "strong" or job.train.get("global_batch") is not None:
            raise UsageError("batch_size max is a per-device batch: use it with weak scaling, "
                             "not with a global batch")
        if job.train.get("device_memory") is not None:  # a cgroup's charge, not the RSS
            raise UsageError("batch_size max searches against the resident memory of probes, "
                             "not under --device-memory's cap: give the per-device batches to "
                             "try instead (a run over the cap is recorded oom, and larger "
                             "ones are skipped)")
    if dry_run:
        for job in jobs:
            job.params["batch_size"] = job.train["batch_size"] = MAX
            job.per_device_batch = job.global_batch = None
        echo("batch_size max: the batch search runs for each model when the study runs (not "
             "in a dry run); the plan shows 'max'")
        return
    found: dict[tuple, int] = {}
    for job in jobs:
        key = _key(job.train)
        if key not in found:
            found[key] = search({f: job.train[f] for f in (*SEARCH_FIELDS, "gpus")
                                 if f in job.train})
            echo(f"batch_size max for {job.train.get('task') or job.train.get('model', 'smallcnn')}"
                 f": {found[key]} per device")
        job.params["batch_size"] = job.train["batch_size"] = found[key]
        cfg = TrainConfig.from_dict(job.train)
        derived = derive(cfg, job.world_size, sync.strategy_of(cfg).replicas_per_device(cfg))
        job.per_device_batch, job.global_batch = derived.per_device_batch, derived.global_batch
