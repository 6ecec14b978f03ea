"""Synchronisation strategies, one file each, chosen by name through this registry.

The registry also gathers what each strategy declares about its options (``Strategy.declares``,
sync/options.py), so that the command line, ``bench``, validation and the record know them
without a table of their own. Adding a strategy: its file, and its class in ``_BUILT_IN``.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.runtime.world import World
from parascale.sync.allreduce import AllReduce
from parascale.sync.base import Strategy
from parascale.sync.fsdp import FSDP
from parascale.sync.independent import Independent
from parascale.sync.local_sgd import LocalSGD
from parascale.sync.options import Option
from parascale.sync.parameter_server import ParameterServer
from parascale.sync.reduce_broadcast import ReduceBroadcast
from parascale.sync.sma import SMA
from parascale.sync.zero import Zero

_BUILT_IN = (AllReduce, ReduceBroadcast, ParameterServer, LocalSGD, SMA, Zero, FSDP, Independent)
_REGISTRY: dict[str, type[Strategy]] = {}
#: the baseline: trains like any strategy but exchanges nothing, so it ignores their options
IGNORES_OPTIONS = Independent.name


def register(cls: type[Strategy]) -> type[Strategy]:
    """Add a strategy (its name must be new); returns it, so it can decorate the class."""
    if cls.name in _REGISTRY:
        raise ValueError(f"a strategy named {cls.name!r} is registered already")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    for option in cls.declares:
        if (option.kind is None) != (option.name in fields):
            raise TypeError(f"{cls.__name__} option {option.name!r}: a TrainConfig field takes "
                            "its type and default from the field, any other option declares both")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    del _REGISTRY[name]


for _cls in _BUILT_IN:
    register(_cls)


def names() -> list[str]:
    return list(_REGISTRY)


def check(name: str) -> None:
    """Unknown names fail before any worker starts, with the valid names listed."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown --sync {name!r}{hint} (choose from {', '.join(names())})")


def options() -> dict[str, tuple[Option, list[str]]]:
    """Every declared option, with the strategies that take it (first declarer first)."""
    found: dict[str, tuple[Option, list[str]]] = {}
    for name, cls in _REGISTRY.items():
        for option in cls.declares:
            found.setdefault(option.name, (option, []))[1].append(name)
    return found


def help_of(name: str) -> str:
    """An option's help: each declaring strategy's own words (``period``: local SGD's and SMA's)."""
    texts = [o.help for cls in _REGISTRY.values() for o in cls.declares if o.name == name]
    return " ".join(" ".join(t.split()) for t in dict.fromkeys(texts))


def applies(name: str, settings: Mapping[str, Any]) -> bool:
    """Whether option ``name`` means something in a configuration given as a (partial) dict of
    TrainConfig fields (bench's studies): its strategy is chosen, and its ``only_with`` holds."""
    option, owners = options()[name]
    defaults = TrainConfig()
    if settings.get("sync", defaults.sync) not in owners:
        return False
    return option.holds(lambda other: settings.get(other, getattr(defaults, other, None)))


def validate(cfg: TrainConfig) -> None:
    """The values of every strategy option, and none of one strategy given with another."""
    declared = options()
    for name, (option, _) in declared.items():
        option.check(option.value(cfg))
    for name, value in cfg.sync_options.items():
        if name not in declared or declared[name][0].kind is None:
            raise UsageError(_not_a_sync_option(name, declared))
    # --sync none ignores them all, so a baseline is any run with --sync changed to none
    if cfg.sync == IGNORES_OPTIONS:
        return
    for name, (option, owners) in declared.items():
        value = option.value(cfg)
        if value == option.default_in(cfg):
            continue
        if cfg.sync not in owners:
            raise UsageError(f"--{name.replace('_', '-')} {value} belongs to --sync {owners[0]}, "
                             f"not --sync {cfg.sync}"
                             + (f" ({', '.join(owners[1:])} "
                                f"{'takes' if len(owners) == 2 else 'take'} it too)"
                                if owners[1:] else ""))
        if not option.applies(cfg):
            other, wanted = option.only_with  # type: ignore[misc]
            raise UsageError(f"--{name.replace('_', '-')} {value} belongs to "
                             f"--{other.replace('_', '-')} {wanted}, not "
                             f"--{other.replace('_', '-')} {getattr(cfg, other)}")
    if cfg.sync in _REGISTRY:
        refusal = _REGISTRY[cfg.sync].refuse(cfg)
        if refusal:
            raise UsageError(refusal)


def _not_a_sync_option(name: str, declared: Mapping[str, tuple[Option, list[str]]]) -> str:
    if name in declared:  # a TrainConfig field, which has its own flag
        return (f"--sync-option {name}: the built-in strategies take their own flags; give it "
                f"as --{name.replace('_', '-')}")
    extra = sorted(n for n, (o, _) in declared.items() if o.kind is not None)
    return (f"--sync-option {name}: no strategy declares it ("
            + (f"known: {', '.join(extra)}" if extra else
               "the built-in strategies take their own flags: " + ", ".join(
                   f"--{n.replace('_', '-')}" for n, (o, _) in declared.items()
                   if o.kind is None)) + ")")


def strategy_of(cfg: TrainConfig) -> type[Strategy]:
    """The class of ``cfg``'s strategy, whose class methods answer what the launcher and the
    batch arithmetic ask before any worker starts (``helper_processes``,
    ``replicas_per_device``, ``resolves_before_training``). An unknown name gets the base
    class's answers: :func:`check` refuses it, in its own turn."""
    return _REGISTRY.get(cfg.sync, Strategy)


def build(cfg: TrainConfig, world: World) -> Strategy:
    check(cfg.sync)
    return _REGISTRY[cfg.sync](cfg, world)


__all__ = ["Option", "Strategy", "applies", "build", "check", "help_of", "names", "options",
           "register", "strategy_of", "unregister", "validate"]
