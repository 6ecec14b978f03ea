"""What a checkpoint reads of a run and puts back (``Trained``): the loop's ``Run`` is one.

Declared here, as the parts this room uses, so that checkpoints need nothing of the loop that
writes them (the loop's run holds the checkpoint writer)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from parascale.runtime import World
    from parascale.sync.base import Strategy
    from parascale.training.observe.divergence import DivergenceWatch
    from parascale.training.record.progress import Progress


class Trained(Protocol):
    """A run's world and the trained state a checkpoint keeps: the model as the strategy wraps
    it, the optimizer, the gradient scaler, the strategy's own state and the run's progress;
    and the divergence check, which decides every step before a checkpoint holds it."""

    world: World
    strategy: Strategy
    net: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    progress: Progress
    divergence: DivergenceWatch
