"""Learning-rate schedule: warm-up to the scaled rate, then constant, cosine or step decay.

The scaled (effective) rate comes from ``batch.resolve_lr``: linear (Goyal et al. 2017) or
square-root scaling from a stated base batch. Gradual warm-up, as in Goyal et al., starts at the
unscaled rate and rises linearly to the effective one over ``warmup_epochs``; large effective
batches diverge without it.
"""
from __future__ import annotations

import math


def lr_at(step: int, *, base_lr: float, effective_lr: float, warmup_steps: int,
          total_steps: int, schedule: str = "constant", steps_per_epoch: int = 1,
          milestones: tuple[int, ...] = (), gamma: float = 0.1, from_zero: bool = False,
          lr_min: float = 0.0) -> float:
    """Rate for the 0-based optimizer step ``step``. ``from_zero``: the warm-up rises from 0
    (nanoGPT's ``lr * (step + 1) / (warmup + 1)``, never a step at rate 0) rather than from
    ``base_lr``; ``lr_min``: where the cosine ends."""
    if step < warmup_steps:
        if from_zero:
            return effective_lr * (step + 1) / (warmup_steps + 1)
        return base_lr + (effective_lr - base_lr) * step / warmup_steps
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        fraction = min(1.0, (step - warmup_steps) / span)
        return lr_min + 0.5 * (effective_lr - lr_min) * (1 + math.cos(math.pi * fraction))
    if schedule == "step":
        epoch = step // max(1, steps_per_epoch)
        return effective_lr * gamma ** sum(epoch >= m for m in milestones)
    return effective_lr
