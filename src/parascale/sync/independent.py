"""No synchronisation at all: the contention baseline of a scaling study.

The same N processes train N independent replicas that never exchange a gradient. Their
throughput against the synchronised run separates the cost of synchronisation from what the
machine costs by itself when N processes share it (memory bandwidth, caches, other tenants).
"""
from __future__ import annotations

from parascale.sync.base import Strategy
from parascale.sync.traits import Traits


class Independent(Strategy):
    name = "none"
    traits = Traits(exchanges=False)

    def wrap(self, model):
        self.bytes_per_step = 0
        return super().wrap(model)
