"""ZeRO stage 1: DDP's gradient allreduce, each rank keeping and updating only its part of the
optimizer state (torch's ``ZeroRedundancyOptimizer``), then broadcasting its updated parameters.

Gradients and parameters stay whole on every rank; the optimizer's state (momentum, Adam's
moments) is split by parameter across the ranks, so it costs 1/N of its replicated size.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.sync.allreduce import Bucketed
from parascale.sync.traits import Pattern, Traits

if TYPE_CHECKING:
    import torch
    import torch.distributed.optim as distributed_optim
else:  # the registry is read without torch: imported on first use
    distributed_optim = lazy.module("torch.distributed.optim", globals())


def rebuild(optimizer: torch.optim.Optimizer, **extra) -> torch.optim.Optimizer:
    """``optimizer``'s class, parameter groups and settings, as a ZeroRedundancyOptimizer.

    Only the settings its class's constructor takes are passed on: torch keeps a few in
    ``defaults`` that no constructor takes (AdamW's ``decoupled_weight_decay``, which its
    class fixes), and the rebuilt optimizer's ``defaults`` get them again from the class."""
    groups = [{k: v for k, v in g.items() if k != "initial_lr"} for g in optimizer.param_groups]
    return distributed_optim.ZeroRedundancyOptimizer(
        groups, optimizer_class=type(optimizer), **_constructor_settings(optimizer), **extra)


def _constructor_settings(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    accepted = inspect.signature(type(optimizer)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return dict(optimizer.defaults)
    return {k: v for k, v in optimizer.defaults.items() if k in accepted}


class Zero(Bucketed):
    """ZeRO stage 1 under DDP. The update itself, and its broadcast of each rank's updated
    parameters to the others, are the "optimizer" phase."""

    name = "zero"
    # each rank writes its optimizer part; any worker count reads it
    traits = Traits(shards=frozenset({"state"}), shards_checkpoint=True, mean_gradient=True,
                    script_refusal="it replaces the script's optimizer with a sharded one")
    # gradients travel uncompressed (Bucketed's): the compression options stay allreduce's

    @classmethod
    def pattern(cls, settings) -> Pattern:
        # DDP's allreduce (2 passes, hidden behind backward), then each rank's updated part
        # broadcast to the others (1 pass, after the update)
        return Pattern(overlaps=True, passes=3, after=1, stage=1)

    @classmethod
    def stages(cls) -> dict[int, dict[str, Any]]:
        return {1: {}}

    def wrap(self, model):
        wrapped = super().wrap(model)
        n = self.world.size
        if n > 1:  # and each rank's updated part to the N-1 others: (N-1)/N of the parameters
            self.bytes_per_step = (self.bytes_per_step or 0) + int((n - 1) / n * sum(
                p.numel() * p.element_size() for p in model.parameters()))
        return wrapped

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        if self.world.size == 1:
            # one rank holds every part anyway: run the plain optimizer, and say so
            if self.world.is_main:
                print("parascale: --sync zero on one worker: nothing to shard, the optimizer "
                      "state is whole (as under --sync allreduce)", flush=True)
            return optimizer
        self._sharded = rebuild(optimizer)
        return self._sharded

    def optimizer_part(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        # ZeroRedundancyOptimizer steps its local optimizer over this rank's parameters; that
        # one's state, keyed by parameter name, is what another partition can be made from
        return getattr(optimizer, "optim", optimizer)

    def options(self) -> dict:
        return {**super().options(), "sharded": self.world.size > 1, "stage": 1}
