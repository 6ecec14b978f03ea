"""``validate(cfg)``: everything about a configuration that can be checked without a world.

It sits above both halves it joins: the configuration's sections (:mod:`parascale.config`) and
the strategies' options and refusals (:mod:`parascale.sync`, whose modules import the
configuration). Keeping it here, rather than in ``TrainConfig.validate``, is what keeps the
strategies from importing a module that imports them (tests/test_layers.py).
"""
from __future__ import annotations

from parascale import sync
from parascale.config import TrainConfig
from parascale.runtime import memory_cap

__all__ = ["validate"]

def validate(cfg: TrainConfig) -> None:
    """Raise :class:`parascale.errors.UsageError` with one line for the first thing wrong: each
    section alone, then what spans sections (:meth:`TrainConfig.validate`), then the strategy
    and its options, and last the helper processes it starts against a memory cap. A
    configuration that passes is settled in place: its strategy, the default when it names
    none, and every option of it are named (:func:`parascale.sync.settle`), as its record will
    state them."""
    cfg.validate()
    sync.validate(cfg)
    memory_cap.check_helpers(cfg.processes.device_memory, str(cfg.strategy.sync),
                             sync.strategy_of(cfg).helper_processes(cfg))
