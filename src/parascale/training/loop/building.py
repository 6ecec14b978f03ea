"""The model a rank trains, as built before the strategy wraps it: whole on every rank, or,
under a strategy that shards the parameters, without storage (models/deferred.py), so that
the strategy materialises only this rank's shards and no rank ever holds the whole model.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from parascale import sync
from parascale.models import deferred
from parascale.runtime import World
from parascale.runtime.processes import map_large_buffers

#: where the strategy shards the parameters on the CPU, buffers from this size up are mapped
#: on their own: glibc would keep the gathered units and gradients each step frees in its
#: heap, and the resident peak would be theirs, not what the rank holds (docs/design.md)
MAP_FROM = 128 << 10


def shards_parameters(cfg, world: World) -> bool:
    """Whether this run's strategy keeps only a part of the parameters on each rank."""
    return world.size > 1 and "params" in sync.traits_of(cfg.strategy.sync).shards


def build_model(cfg, world: World, factory: Callable[[], nn.Module]) -> nn.Module:
    """``factory()`` after ``torch.manual_seed(cfg.job.seed)`` (identical initial parameters on
    every rank, and on any number of ranks): on the meta device with its recipe where the
    strategy shards the parameters and the construction can be replayed, else whole on this
    rank's device (rank 0 says why, in one line)."""
    torch.manual_seed(cfg.job.seed)
    if shards_parameters(cfg, world):
        if world.device.type == "cpu":
            map_large_buffers(MAP_FROM)
        try:
            return deferred.build(factory)
        except deferred.NotReplayable as exc:
            model = factory()
            if world.is_main:
                size = sum(p.numel() * p.element_size() for p in model.parameters())
                print(f"parascale: --sync {cfg.strategy.sync} builds {type(model).__name__} whole "
                      f"on every rank, then shards it ({exc}): each rank holds all of its "
                      f"parameters ({size / 2**20:,.0f} MiB) until then", flush=True)
            return model.to(world.device)
    return factory().to(world.device)
