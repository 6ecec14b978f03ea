"""The dataset registry: names resolve to loaders, and nothing else knows a dataset's type.

`check(cfg)` runs once in the launching process and turns bad input (unknown name, missing
folder or files) into one UsageError line before any worker starts; `prepare(cfg)` builds it
there, once, and keeps it for the local workers (see `handover`); `build(cfg)` runs in every
worker and returns a `DataBundle` whose splits turn index batches into tensors on a device.

Each dataset's module is imported only when that dataset is used, so listing names or
checking `digits` never pays for importing torchvision.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from parascale.config import TrainConfig
from parascale.data import handover
from parascale.errors import UsageError

if TYPE_CHECKING:
    from parascale.data.split import DataBundle, Split

__all__ = ["DataBundle", "FIELDS", "Split", "build", "check", "elsewhere", "handover_env", "names",
           "prepare", "tokens_per_sample"]

# name -> module under parascale.data providing check(cfg) and build(cfg)
_REGISTRY: dict[str, str] = {
    "synthetic": "builtin",
    "digits": "builtin",
    "cifar10": "vision",
    "mnist": "vision",
    "fashion-mnist": "vision",
    "imagefolder": "folder",
    "shakespeare": "text",
}


#: The TrainConfig fields a data set is built from (every loader reads only these); kept in
#: handover, which identifies a data set by them, so that it need not import this package
FIELDS = handover.FIELDS


def __getattr__(name: str):
    """``DataBundle`` and ``Split``, from their module on first use (it imports torch)."""
    if name in ("DataBundle", "Split"):
        from parascale.data import split

        return getattr(split, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def names() -> list[str]:
    """The registered dataset names."""
    return list(_REGISTRY)


def _module(cfg: TrainConfig):
    if cfg.data.dataset not in _REGISTRY:
        raise UsageError(f"unknown dataset {cfg.data.dataset!r}; valid datasets: "
                         f"{', '.join(names())}")
    return importlib.import_module(f"parascale.data.{_REGISTRY[cfg.data.dataset]}")


def tokens_per_sample(cfg: TrainConfig) -> int | None:
    """Tokens per sample of a text dataset (its throughput is counted in them), else None."""
    return cfg.data.context if _REGISTRY.get(cfg.data.dataset) == "text" else None


def elsewhere(cfg: TrainConfig) -> bool:
    """Whether --data-dir names a folder this machine does not have: on a cluster data often
    lives on a file system only the compute nodes mount, so a Slurm job checks it there (the
    worker refuses a missing folder in one line). With --download it is fetched here."""
    return bool(cfg.data.data_dir) and not cfg.data.download and \
        not os.path.lexists(os.path.expanduser(cfg.data.data_dir))


def check(cfg: TrainConfig) -> None:
    """Cheap validation before any worker starts: raises UsageError with one line saying what is
    wrong and what would be right. With --download, fetches missing files here, once."""
    _module(cfg).check(cfg)


def build(cfg: TrainConfig) -> DataBundle:
    """Load the dataset (called in every worker; the same data on every rank): the launcher's
    copy when it handed one over (see :mod:`.handover`), else from the source."""
    from parascale.data.split import hold_out

    loader = _module(cfg)
    return hold_out(handover.take(cfg, loader) or loader.build(cfg), cfg.data.val_fraction,
                    cfg.job.seed)


def prepare(cfg: TrainConfig, keep: bool = False) -> dict:
    """Build the dataset in the launching process, once per data set and source; its facts
    (``train``, ``test``, ``num_classes``, ``input_shape``). ``keep`` saves it for the workers,
    whose environment :func:`handover_env` then names the file."""
    from parascale.data.split import held_out

    facts = dict(handover.prepare(cfg, _module(cfg), keep))
    held = held_out(facts["train"], cfg.data.val_fraction)  # as build() will hold out
    return {**facts, "train": facts["train"] - held, "val": held}


def handover_env(cfg: TrainConfig) -> dict[str, str]:
    """The workers' environment variable naming the data ``prepare`` kept, or nothing."""
    path = handover.file_for(cfg, _module(cfg))
    return {handover.ENV: str(path)} if path else {}
