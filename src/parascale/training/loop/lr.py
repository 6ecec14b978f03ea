"""Learning-rate schedule: warm-up to the scaled rate, then constant, cosine or step decay.

The scaled (effective) rate comes from ``batch.resolve_lr``: linear (Goyal et al. 2017) or
square-root scaling from a stated base batch. Gradual warm-up, as in Goyal et al., starts at the
unscaled rate and rises linearly to the effective one over ``warmup_epochs``; large effective
batches diverge without it.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parascale.config import OptimConfig


def lr_at(step: int, optim: OptimConfig, *, effective_lr: float, warmup_steps: int,
          total_steps: int, steps_per_epoch: int = 1) -> float:
    """Rate for the 0-based optimizer step ``step`` under ``optim``'s schedule, from the run's
    plan: its effective rate, warm-up steps (``--warmup-steps``, or ``--warmup-epochs`` in
    steps), steps in all and per epoch. A warm-up given in steps rises from 0 (nanoGPT's
    ``lr * (step + 1) / (warmup + 1)``, never a step at rate 0), one in epochs from ``--lr``;
    the cosine ends at ``--lr-min``."""
    if step < warmup_steps:
        if optim.warmup_steps > 0:
            return effective_lr * (step + 1) / (warmup_steps + 1)
        return optim.lr + (effective_lr - optim.lr) * step / warmup_steps
    if optim.lr_schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        fraction = min(1.0, (step - warmup_steps) / span)
        lr_min = optim.lr_min
        return lr_min + 0.5 * (effective_lr - lr_min) * (1 + math.cos(math.pi * fraction))
    if optim.lr_schedule == "step":
        epoch = step // max(1, steps_per_epoch)
        return effective_lr * optim.lr_gamma ** sum(epoch >= m for m in optim.lr_milestones)
    return effective_lr
