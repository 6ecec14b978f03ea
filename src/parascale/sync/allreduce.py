"""Ring allreduce through DistributedDataParallel: bucketed and overlapped with backward."""
from __future__ import annotations

import contextlib

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from parascale.sync.base import Strategy, parameter_bytes


class AllReduce(Strategy):
    """DDP. Gradients are averaged in buckets of ``--bucket-mb`` while backward still runs, so
    most communication hides behind compute; its cost shows inside the "compute" phase."""

    name = "allreduce"

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.world.device] if self.world.device.type == "cuda" else None
        self.model = DistributedDataParallel(model, device_ids=device_ids,
                                             bucket_cap_mb=self.cfg.bucket_mb)
        n = self.world.size
        # ring allreduce: every rank sends 2(n-1)/n of the gradient bytes
        self.bytes_per_step = int(2 * (n - 1) / n * parameter_bytes(model))
        return self.model

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        # gradients of non-final micro-batches stay local; the last backward reduces the sum
        return contextlib.nullcontext() if last else self.model.no_sync()

    def options(self) -> dict:
        return {"bucket_mb": self.cfg.bucket_mb}
