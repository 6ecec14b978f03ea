"""Synchronisation strategies, one file each, chosen by name through this registry.

Every other package asks the registry what a strategy is instead of spelling its name: its
traits (``traits_of``: what it shards, whether it runs a user's script, which optimizer it
updates with...), its options (``options``, ``help_of``, ``applies``; declared by each
strategy's ``Settings``), its collective pattern for the cost model (``get(name).pattern``),
and the two strategies others single out, :data:`DEFAULT` and :data:`BASELINE`. Nothing here
imports torch: the strategies' files import it on first use (parascale/lazy.py), so ``--help``
and ``report`` read the registry without it.

Adding a strategy: its file, and its class in ``_BUILT_IN``; or, from outside parascale,
``sync.register(cls)`` (the processes a launch starts register it too: its ``module:qualname``
travels in ``contract.STRATEGIES``), or ``--sync package.module:Class``.
"""
from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from parascale.config import NAMES, TrainConfig
from parascale import safejson
from parascale.errors import UsageError
from parascale.runtime import contract
from parascale.sync.allreduce import AllReduce
from parascale.sync.base import Strategy
from parascale.sync.fsdp import FSDP
from parascale.sync.independent import Independent
from parascale.sync.local_sgd import LocalSGD
from parascale.sync.options import Option, Settings, option
from parascale.sync.parameter_server import ParameterServer
from parascale.sync.reduce_broadcast import ReduceBroadcast
from parascale.sync.sma import SMA
from parascale.sync.traits import GRADIENT, SHARDABLE, UPDATE, Pattern, Traits
from parascale.sync.zero import Zero

if TYPE_CHECKING:
    from parascale.runtime.world import World

_BUILT_IN = (AllReduce, ReduceBroadcast, ParameterServer, LocalSGD, SMA, Zero, FSDP, Independent)
_REGISTRY: dict[str, type[Strategy]] = {}
#: the strategy of a configuration that names none
DEFAULT = AllReduce.name
#: the contention baseline: trains like any strategy but exchanges nothing, so it ignores every
#: strategy's options (a study's baseline is its run with --sync changed to this)
BASELINE = Independent.name
_INSIDE = __name__ + "."  # the modules of the built-in strategies


def register(cls: type[Strategy]) -> type[Strategy]:
    """Add a strategy (its name must be new); returns it, so it can decorate the class. One
    defined outside parascale is remembered for the processes this one starts."""
    if _REGISTRY.get(cls.name) is cls:
        return cls
    if cls.name in _REGISTRY:
        raise ValueError(f"a strategy named {cls.name!r} is registered already")
    if not isinstance(cls.traits, Traits) or not issubclass(cls.Settings, Settings):
        raise TypeError(f"{cls.__name__}: traits is a sync.Traits, Settings a sync.Settings")
    declared = options()
    for opt in cls.Settings.declared():
        if opt.name in NAMES:
            raise TypeError(f"{cls.__name__} option {opt.name!r} is a TrainConfig field")
        other = declared.get(opt.name, (opt, []))[0]
        if (other.kind, other.default, other.flag) != (opt.kind, opt.default, opt.flag):
            raise TypeError(f"{cls.__name__} option {opt.name!r}: declared by "
                            f"{', '.join(declared[opt.name][1])} with another type, default or "
                            "flag; one name is one option")
    _REGISTRY[cls.name] = cls
    if not cls.__module__.startswith(_INSIDE):
        _remember(f"{cls.__module__}:{cls.__qualname__}", add=True)
    return cls


def unregister(name: str) -> None:
    cls = _REGISTRY.pop(name)
    _remember(f"{cls.__module__}:{cls.__qualname__}", add=False)


def _remember(spec: str, add: bool) -> None:
    """Keep ``contract.STRATEGIES`` (which the processes a launch starts inherit) in step."""
    held = _inherited()
    held = [s for s in held if s != spec] + ([spec] if add else [])
    if held:
        os.environ[contract.STRATEGIES] = safejson.dumps(held)
    else:
        os.environ.pop(contract.STRATEGIES, None)


def _inherited() -> list[str]:
    try:
        held = json.loads(os.environ.get(contract.STRATEGIES) or "[]")
    except json.JSONDecodeError:
        held = []
    return [s for s in held if isinstance(s, str)] if isinstance(held, list) else []


def _load(spec: str) -> type[Strategy]:
    """The strategy class ``package.module:Class`` names, registered; one line if it cannot be
    found or is no strategy. Found as a ``--model`` or ``--task`` of one's own is (the working
    folder, then ``sys.path``)."""
    from parascale.models.user import resolve_user  # it imports torch: only for this

    found = resolve_user(spec, kind="--sync")
    if not (isinstance(found, type) and issubclass(found, Strategy)):
        raise UsageError(f"--sync {spec} is not a parascale.sync.Strategy subclass")
    return register(found)


def names() -> list[str]:
    return list(_REGISTRY)


def check(name: str | None) -> str:
    """The registered name ``name`` stands for (None: :data:`DEFAULT`; ``package.module:Class``
    is loaded and registered); unknown names fail before any worker starts, with the valid
    names listed."""
    name = name or DEFAULT
    if name not in _REGISTRY and ":" not in name:
        _adopt_inherited()  # this process may have been forked before they could be loaded
    if name in _REGISTRY:
        return name
    if ":" in name:
        return _load(name).name
    close = difflib.get_close_matches(name, names(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    lost = f"; {'; '.join(_NOT_LOADED)}" if _NOT_LOADED else ""
    raise UsageError(f"unknown --sync {name!r}{hint} (choose from {', '.join(names())}, or "
                     f"package.module:Class{lost})")


def get(name: str | None) -> type[Strategy]:
    """The strategy class of ``name`` (UsageError for an unknown one)."""
    return _REGISTRY[check(name)]


def traits_of(name: str | None) -> Traits:
    """What strategy ``name`` declares; a name not registered here (a record of a strategy of
    someone else's) gets the defaults."""
    cls = _REGISTRY.get(name or DEFAULT)
    return cls.traits if cls is not None else Traits()


def with_trait(**wanted: Any) -> list[str]:
    """The strategies whose traits have these values, e.g. ``with_trait(learners=True)``."""
    return [name for name, cls in _REGISTRY.items()
            if all(getattr(cls.traits, k) == v for k, v in wanted.items())]


def with_pattern() -> list[str]:
    """The strategies that declare a collective pattern (at their options' defaults): those
    the cost model (``parascale predict``) can describe."""
    return [name for name, cls in _REGISTRY.items() if cls.pattern(cls.Settings()) is not None]


def options() -> dict[str, tuple[Option, list[str]]]:
    """Every declared option, with the strategies that take it (first declarer first)."""
    found: dict[str, tuple[Option, list[str]]] = {}
    for name, cls in _REGISTRY.items():
        for opt in cls.Settings.declared():
            found.setdefault(opt.name, (opt, []))[1].append(name)
    return found


def help_of(name: str) -> str:
    """An option's help: each declaring strategy's own words (``period``: local SGD's and SMA's)."""
    texts = [o.help for cls in _REGISTRY.values() for o in cls.Settings.declared()
             if o.name == name]
    return " ".join(dict.fromkeys(texts))


def applies(name: str, settings: Mapping[str, Any]) -> bool:
    """Whether option ``name`` means something in a configuration given as a (partial) dict of
    TrainConfig fields and options (bench's studies, hpo's trials): its strategy is chosen, and
    its ``only_with`` holds."""
    cls = _REGISTRY.get(settings.get("sync") or DEFAULT)
    if cls is None:
        return False
    given = {**(settings.get("sync_options") or {}), **settings}
    declared = {o.name: o for o in cls.Settings.declared()}
    if name not in declared:
        return False
    return declared[name].holds(lambda other: given.get(other, declared[other].default))


def validate(cfg: TrainConfig) -> None:
    """The strategy, the values of its options, and none of another strategy given with it; then
    the configuration is settled (:func:`settle`)."""
    name = check(cfg.strategy.sync)  # first: package.module:Class brings its options
    declared = options()
    unknown = [k for k in cfg.strategy.sync_options if k not in declared]
    if unknown:
        raise UsageError(_unknown(unknown, declared))
    cls = _REGISTRY[name]
    own = {o.name: o for o in cls.Settings.declared()}
    for key, value in cfg.strategy.sync_options.items():
        (own.get(key) or declared[key][0]).check(value)
    # the baseline ignores them all, so a baseline is any run with --sync changed to it
    if name != BASELINE:
        settings = cls.Settings.of(cfg.strategy.sync_options)
        for key, value in cfg.strategy.sync_options.items():
            _check_placed(key, value, name, own, declared, settings)
        refusal = cls.refuse(cfg) or _optimizer_refusal(cls, cfg)
        if refusal:
            raise UsageError(refusal)
    settle(cfg)


def _check_placed(key: str, value: Any, name: str, own: dict[str, Option],
                  declared: dict[str, tuple[Option, list[str]]], settings: Settings) -> None:
    """An option given with a strategy that does not take it, or set without the value of
    another option it needs, is one line. Another strategy's option with a flag of its own
    passes at its default: such options were once settings of every run, and every
    configuration written then holds them; one given through --sync-option was meant."""
    opt, (first, owners) = own.get(key), declared[key]
    if opt is None:
        if first.flag and value == first.default:
            return
        others = owners[1:]
        raise UsageError(f"{first.given(value)} belongs to --sync {owners[0]}, not "
                         f"--sync {name}" + (f" ({', '.join(others)} "
                                             f"{'takes' if len(others) == 1 else 'take'} it too)"
                                             if others else ""))
    if opt.only_with is not None and value != opt.default \
            and not opt.holds(lambda o: getattr(settings, o)):
        other, wanted = opt.only_with
        needed = own[other]
        raise UsageError(f"{opt.given(value)} belongs to {needed.given(wanted)}, not "
                         f"{needed.given(getattr(settings, other))}")


def _optimizer_refusal(cls: type[Strategy], cfg: TrainConfig) -> str | None:
    wanted = cls.traits.optimizer
    if wanted is None or cfg.optim.optimizer == wanted:
        return None
    return (f"--sync {cls.name} {cls.traits.optimizer_why}; leave out --optimizer "
            f"{cfg.optim.optimizer}")


def _unknown(keys: list[str], declared: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(keys[0], [*NAMES, *declared], n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else \
        f" (the strategies' options: {', '.join(declared)})"
    return f"unknown training option(s) {', '.join(keys)}{hint}"


def settle(cfg: TrainConfig) -> None:
    """Name what ``cfg`` left to the registry, in place, so that the record states it: the
    strategy (:data:`DEFAULT` when none is given) and every option of it (its default when
    not given); options of other strategies, which validation let pass at their defaults, are
    left out. The baseline keeps the options it was given and ignores: its record says which
    synchronised run it is the baseline of (the report pairs them by their settings)."""
    cls = get(cfg.strategy.sync)
    cfg.strategy.sync = cls.name
    if cls.name != BASELINE:
        cfg.strategy.sync_options = cls.Settings.of(cfg.strategy.sync_options).values()


def settled(cfg: TrainConfig) -> TrainConfig:
    """A settled copy of ``cfg`` (:func:`settle`; ``cfg`` itself is left as it was)."""
    copy = cfg.replace(sync_options=dict(cfg.strategy.sync_options))
    settle(copy)
    return copy


def strategy_of(cfg: TrainConfig) -> type[Strategy]:
    """The class of ``cfg``'s strategy, whose class methods answer what the launcher and the
    batch arithmetic ask before any worker starts (``helper_processes``,
    ``replicas_per_device``, ``resolves_before_training``). An unknown name gets the base
    class's answers: :func:`check` refuses it, in its own turn."""
    return _REGISTRY.get(cfg.strategy.sync or DEFAULT, Strategy)


def read_settings(name: str, values: Mapping[str, Any], where: str) -> Settings:
    """Strategy ``name``'s settings from ``values`` that another program wrote (a record's
    config: each option a top-level key, or, written before, some in ``sync_options``), each
    checked; UsageError naming ``where`` for a bad one."""
    cls = get(name)
    nested = values.get("sync_options")
    given = {**(nested if isinstance(nested, Mapping) else {}), **values}
    mine = {}
    for opt in cls.Settings.declared():
        if opt.name in given:
            try:
                opt.check(given[opt.name])
            except UsageError as exc:
                raise UsageError(f"{where}: {exc}") from None
            mine[opt.name] = given[opt.name]
    return cls.Settings.of(mine)


def sharding_stages() -> dict[int, str]:
    """The ZeRO stages the strategies run, each as the options that choose it (``zero``,
    ``fsdp --sync-option stage=2``); 0 is the default strategy, which shards nothing."""
    found = {0: DEFAULT}
    for name, cls in _REGISTRY.items():
        declared = {o.name: o for o in cls.Settings.declared()}
        for stage, chosen in cls.stages().items():
            found.setdefault(stage, " ".join(
                [name, *(declared[k].given(v) for k, v in chosen.items())]))
    return dict(sorted(found.items()))


def noise_refusal(strategy: Strategy) -> str | None:
    """Why the gradient noise scale cannot be measured under the built ``strategy``, naming
    the strategies it is measured under; None when it can be."""
    why = strategy.noise_refusal()
    if why is None or strategy.traits.mean_gradient:
        return why
    able = " or ".join(with_trait(mean_gradient=True))
    return f"{why}; the noise scale is measured under --sync {able}"


def build(cfg: TrainConfig, world: World) -> Strategy:
    return get(cfg.strategy.sync)(cfg, world)


#: strategies the process that started this one registered, which cannot be loaded here, and why
_NOT_LOADED: list[str] = []


def _adopt_inherited() -> None:
    """Register the strategies the process that started this one registered (its
    ``contract.STRATEGIES``); one that cannot be loaded is said when it is asked for, not by
    every process that imports the registry."""
    _NOT_LOADED.clear()
    for spec in _inherited():
        try:
            _load(spec)
        except UsageError as exc:
            _NOT_LOADED.append(f"{spec}, registered by the process that started this one, "
                               f"cannot be loaded here: {exc}")


for _cls in _BUILT_IN:
    register(_cls)
_adopt_inherited()

__all__ = ["BASELINE", "DEFAULT", "GRADIENT", "SHARDABLE", "UPDATE", "Option", "Pattern",
           "Settings", "Strategy", "Traits", "applies", "build", "check", "get", "help_of",
           "names", "noise_refusal", "option", "options", "read_settings", "register", "settle",
           "settled", "sharding_stages", "strategy_of", "traits_of", "unregister", "validate",
           "with_pattern", "with_trait"]
