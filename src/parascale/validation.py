"""``validate(cfg)``: everything about a configuration that can be checked without a world.

It sits above both halves it joins: the configuration's own fields (:mod:`parascale.config`)
and the strategies' options and refusals (:mod:`parascale.sync`, whose modules import the
configuration). Keeping it here, rather than in ``config.validate``, is what keeps the
strategies from importing a module that imports them (tests/test_layers.py).
"""
from __future__ import annotations

from parascale import config, sync
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.runtime import memory_cap

__all__ = ["validate"]

#: TFLOP/s: a device slower than 1 GFLOP/s trains nothing, so a peak below it is a typo, whose
#: utilisation would print hundreds of digits
MIN_PEAK_TFLOPS = 1e-3


def validate(cfg: TrainConfig) -> None:
    """Raise :class:`parascale.errors.UsageError` with one line for the first thing wrong: each
    field alone, then the strategies' options, then how the fields combine (the order the
    checks have always run in, so the same input gets the same line). A configuration that
    passes is settled in place: its strategy, the default when it names none, and every
    option of it are named (:func:`parascale.sync.settle`), as its record will state them."""
    config.check_fields(cfg)
    if cfg.peak_tflops is not None and cfg.peak_tflops < MIN_PEAK_TFLOPS:
        raise UsageError(f"--peak-tflops must be at least {MIN_PEAK_TFLOPS:g} (1 GFLOP/s), got "
                         f"{cfg.peak_tflops:g}")
    sync.validate(cfg)
    config.check_combinations(cfg)
    memory_cap.check_helpers(cfg.device_memory, str(cfg.sync),
                             sync.strategy_of(cfg).helper_processes(cfg))
