"""The interface every synchronisation strategy implements; the trainer knows nothing else.

A training step, as the loop runs it::

    for each micro-batch:                       # phase "compute"
        with strategy.accumulating(last=...):   #   no gradient exchange on non-final micro-batches
            forward, backward
    strategy.synchronize()                      # phase "sync": exposed communication, if any
    strategy.step(optimizer, scaler)            # phase "optimizer"
    strategy.after_step(step)                   # e.g. local SGD's periodic averaging

Strategies that overlap communication with backward (DDP) do their work inside "compute" and
leave ``synchronize`` empty; strategies that communicate after backward do it in ``synchronize``,
so the record's phase split shows what each one costs.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parascale.config import TrainConfig
from parascale.runtime.world import World


class Strategy:
    """Default: plain local training (no exchange). Subclasses override what they change."""

    name = "base"
    #: False for baselines that never exchange gradients (replicas diverge by design)
    exchanges_gradients = True

    def __init__(self, cfg: TrainConfig, world: World):
        self.cfg = cfg
        self.world = world
        self.model: nn.Module | None = None
        #: bytes this rank sends per optimizer step, where the strategy knows it
        self.bytes_per_step: int | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        """Take the model (already on the device) and return the module the loop trains."""
        self.model = model
        return model

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward and backward; ``last`` is the final one."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Exchange gradients after backward (for strategies that do not overlap it)."""

    def step(self, optimizer: torch.optim.Optimizer, scaler: Any | None = None) -> None:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def after_step(self, step: int) -> None:
        """Called after every optimizer step with the 1-based global step number."""

    def local_module(self) -> nn.Module:
        """The plain model (no wrappers): for evaluation and for saving."""
        module = self.model
        while True:  # DDP keeps the model in .module, torch.compile in ._orig_mod
            inner = getattr(module, "module", None)
            if inner is None:
                inner = getattr(module, "_orig_mod", None)
            if inner is None:
                return module
            module = inner

    def before_evaluation(self) -> None:
        """Make buffers (batch-norm statistics) agree across ranks before evaluating.

        Parameters already agree under a synchronous strategy; buffers are updated locally in
        every forward, so rank 0's are broadcast to keep evaluation one model, not N.
        """
        if self.world.size > 1 and self.exchanges_gradients:
            for buffer in self.local_module().buffers():
                dist.broadcast(buffer, src=0)

    def options(self) -> dict[str, Any]:
        """Strategy settings for the run record."""
        return {}


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
