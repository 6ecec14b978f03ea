"""ZeRO stage 1: DDP's gradient allreduce, each rank keeping and updating only its part of the
optimizer state (torch's ``ZeroRedundancyOptimizer``), then broadcasting its updated parameters.

Gradients and parameters stay whole on every rank; the optimizer's state (momentum, Adam's
moments) is split by parameter across the ranks, so it costs 1/N of its replicated size.
"""
from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from parascale.sync.allreduce import AllReduce
from parascale.sync.options import Option


def rebuild(optimizer: torch.optim.Optimizer, **extra) -> torch.optim.Optimizer:
    """``optimizer``'s class, parameter groups and settings, as a ZeroRedundancyOptimizer."""
    groups = [{k: v for k, v in g.items() if k != "initial_lr"} for g in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer),
                                   **optimizer.defaults, **extra)


class Zero(AllReduce):
    """ZeRO stage 1 under DDP. The update itself, and its broadcast of each rank's updated
    parameters to the others, are the "optimizer" phase."""

    name = "zero"
    shards_checkpoint = True  # each rank writes its optimizer part; any worker count reads it
    # gradients travel uncompressed: the allreduce options stay allreduce's
    declares: tuple[Option, ...] = ()  # type: ignore[assignment]

    @classmethod
    def refuse(cls, cfg) -> str | None:
        return None  # allreduce's refusals concern compression, which zero does not take

    def wrap(self, model):
        wrapped = super().wrap(model)
        n = self.world.size
        if n > 1:  # and each rank's updated part to the N-1 others: (N-1)/N of the parameters
            self.bytes_per_step += int((n - 1) / n * sum(
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
