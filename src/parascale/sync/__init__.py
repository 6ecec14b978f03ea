"""Synchronisation strategies, one file each, chosen by name through this registry."""
from __future__ import annotations

import difflib

from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.runtime.world import World
from parascale.sync.allreduce import AllReduce
from parascale.sync.base import Strategy
from parascale.sync.independent import Independent
from parascale.sync.local_sgd import LocalSGD
from parascale.sync.parameter_server import ParameterServer
from parascale.sync.reduce_broadcast import ReduceBroadcast

_REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (AllReduce, ReduceBroadcast, ParameterServer, LocalSGD, Independent)}


def names() -> list[str]:
    return list(_REGISTRY)


def check(name: str) -> None:
    """Unknown names fail before any worker starts, with the valid names listed."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown --sync {name!r}{hint} (choose from {', '.join(names())})")


def build(cfg: TrainConfig, world: World) -> Strategy:
    check(cfg.sync)
    return _REGISTRY[cfg.sync](cfg, world)


__all__ = ["Strategy", "build", "check", "names"]
