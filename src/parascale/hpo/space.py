"""What a search varies: training options with a range or a list of values.

From the command line, ``--param NAME=SPEC`` where SPEC is ``A,B,C`` (a choice), ``LOW:HIGH``
(uniform) or ``LOW:HIGH:log`` (log-uniform); integer options draw integers. From a file
(``--space``, YAML, JSON or TOML): a mapping of names to a list (a choice), one of those strings,
or ``{low: L, high: H, log: true}``. A strategy's option is drawn only in trials whose strategy
takes it (``period`` when ``sync`` is local-sgd), so strategies and their options can be searched
together: Optuna's define-by-run spaces allow exactly that.
"""
from __future__ import annotations

import itertools
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parascale import sync
from parascale.config import TrainConfig, field_kinds
from parascale.errors import UsageError
from parascale.studydb import clip
from parascale.validation import validate

#: what the search itself decides for every trial, or what does not change a trial's outcome
NOT_SEARCHED = ("workers", "gpus", "device", "backend", "threads", "oversubscribe", "port",
                "timeout", "out", "tensorboard", "save_model", "val_fraction", "evaluate_test",
                "target_accuracy", "stop_at_target", "eval_every", "eval_batches", "sync_options", "data_dir",
                "download", "verify_data", "dataset")


@dataclass(frozen=True)
class Param:
    name: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    def suggest(self, trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)

    def corners(self) -> list[Any]:
        """The values to check before the search starts: every choice, or both ends."""
        if self.choices is not None:
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.integer else [self.low, self.high]

    def describe(self) -> str:
        if self.choices is not None:
            return f"{self.name} in {clip(', '.join(map(str, self.choices)))}"
        scale = "log-uniform" if self.log else "uniform"
        kind = "integer " if self.integer else ""
        return f"{self.name} {kind}{scale} in [{self.low:g}, {self.high:g}]"

    def to_json(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"name": self.name, "choices": list(self.choices)}
        return {"name": self.name, "low": self.low, "high": self.high, "log": self.log,
                "integer": self.integer}


def _option_names() -> dict[str, Any]:
    """Searchable names and their kind: TrainConfig fields and strategies' declared options."""
    kinds = {name: kind for name, (kind, _) in field_kinds().items() if name not in NOT_SEARCHED}
    for name, (option, _) in sync.options().items():
        kinds[name] = option.kind
    return kinds


def _name(raw: Any, where: str) -> tuple[str, Any]:
    name = str(raw).strip().lstrip("-").replace("-", "_")
    kinds = _option_names()
    if name in NOT_SEARCHED:
        raise UsageError(f"{where}: {name} is not searched (the search sets it, or it is the "
                         "same for every trial: give it as a training option)")
    if name not in kinds:
        import difflib

        close = difflib.get_close_matches(name, list(kinds), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UsageError(f"{where}: unknown option {clip(repr(name))}{hint}")
    return name, kinds[name]


def _number(text: Any, where: str) -> float:
    from parascale.bench.values import parse_value

    value = parse_value(text) if isinstance(text, str) else text
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{where}: expected a finite number, got {clip(repr(text))}")
    return value


def _range(name: str, kind: Any, low: Any, high: Any, log: bool, where: str) -> Param:
    low, high = _number(low, where), _number(high, where)
    integer = kind is int or (typing.get_origin(kind) is typing.Union
                              and int in typing.get_args(kind))  # learners: 4 or auto
    if kind is not float and not integer:
        raise UsageError(f"{where}: {name} is not a number; list its values instead "
                         f"(e.g. {name}=a,b)")
    if integer and not (float(low).is_integer() and float(high).is_integer()):
        raise UsageError(f"{where}: {name} takes integers, got {low:g}:{high:g}")
    if not low < high:
        raise UsageError(f"{where}: the range of {name} must have LOW < HIGH, got {low:g}:{high:g}")
    if log and low <= 0:
        raise UsageError(f"{where}: a log range needs LOW > 0, got {low:g}")
    return Param(name, low=float(low), high=float(high), log=log, integer=integer)


def _choices(name: str, values: list[Any], where: str) -> Param:
    if len(values) < 2:
        raise UsageError(f"{where}: {name} has one value; give it as a training option "
                         f"(--{name.replace('_', '-')}) or list at least two")
    if len(set(map(repr, values))) < len(values):
        raise UsageError(f"{where}: {name} lists a value twice")
    for value in values:
        if not isinstance(value, (int, float, str, bool)) or value is None:
            raise UsageError(f"{where}: {name}'s choices are numbers, words or true/false, "
                             f"got {clip(repr(value))}")
    return Param(name, choices=tuple(values))


def parse_param(text: str) -> Param:
    """``--param NAME=SPEC``."""
    from parascale.bench.values import parse_value

    where = f"--param {clip(repr(text))}"
    raw, sep, spec = text.partition("=")
    if not sep or not spec.strip():
        raise UsageError(f"{where}: expected NAME=A,B,C or NAME=LOW:HIGH[:log], "
                         "e.g. lr=0.01:0.5:log")
    name, kind = _name(raw, where)
    spec = spec.strip()
    if ":" in spec and "," not in spec:
        parts = spec.split(":")
        if len(parts) == 3 and parts[2].strip().lower() == "log":
            return _range(name, kind, parts[0], parts[1], True, where)
        if len(parts) == 2:
            return _range(name, kind, parts[0], parts[1], False, where)
        raise UsageError(f"{where}: a range is LOW:HIGH or LOW:HIGH:log")
    return _choices(name, [parse_value(v) for v in spec.split(",")], where)


def load_space(path: str | os.PathLike[str]) -> list[Param]:
    """``--space FILE``: a mapping of option names to their values or range."""
    from parascale.bench.studyfile import read_file

    data = read_file(path, "search space file", (".yaml", ".yml", ".json", ".toml"))
    where = f"search space file {str(path)!r}"
    if not isinstance(data, Mapping) or not data:
        raise UsageError(f"{where} must map option names to values (a list) or a range "
                         "(LOW:HIGH[:log], or low/high/log)")
    params = []
    for raw, spec in data.items():
        name, kind = _name(raw, f"{where}, {clip(str(raw))}")
        at = f"{where}, {name}"
        if isinstance(spec, list):
            params.append(_choices(name, spec, at))
        elif isinstance(spec, str):
            params.append(parse_param(f"{name}={spec}"))
        elif isinstance(spec, Mapping) and set(spec) <= {"low", "high", "log"} \
                and {"low", "high"} <= set(spec):
            log = spec.get("log", False)
            if not isinstance(log, bool):
                raise UsageError(f"{at}: log is true or false, got {clip(repr(log))}")
            params.append(_range(name, kind, spec["low"], spec["high"], log, at))
        else:
            raise UsageError(f"{at}: expected a list of values, 'LOW:HIGH[:log]' or "
                             f"{{low, high, log}}, got {clip(repr(spec))}")
    return params


def merge(given: list[Param], from_file: list[Param]) -> list[Param]:
    """The command line's parameters and the file's, each name once."""
    names = [p.name for p in from_file + given]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"searched more than once: {', '.join(twice)} (in --param and --space, "
                         "or repeated)")
    if not names:
        raise UsageError("nothing to search: give --param NAME=SPEC (e.g. --param "
                         "lr=0.01:0.5:log) or --space FILE")
    return from_file + given


def _is_option(name: str) -> bool:
    return name in sync.options()


def _ordered(space: list[Param]) -> list[Param]:
    """Training options first, then the strategies' options in their declaration order (an
    option that depends on another, such as powersgd_rank on compression, comes after it)."""
    order = list(sync.options())
    return [p for p in space if not _is_option(p.name)] + \
        sorted((p for p in space if _is_option(p.name)), key=lambda p: order.index(p.name))


def settings(space: list[Param], fixed: Mapping[str, Any], draw) -> dict[str, Any]:
    """The searched options of one trial: ``draw(param)`` for each that applies given the
    options fixed and drawn so far (a strategy's option only with that strategy)."""
    chosen: dict[str, Any] = {}
    for param in _ordered(space):
        if _is_option(param.name) and not sync.applies(param.name, {**fixed, **chosen}):
            continue
        chosen[param.name] = draw(param)
    return chosen


def config(fixed: Mapping[str, Any], chosen: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's TrainConfig fields: options without a field go into sync_options."""
    fields = set(field_kinds())
    merged = dict(fixed)
    extra = dict(merged.get("sync_options") or {})
    for name, value in chosen.items():
        if name in fields:
            merged[name] = value
        else:
            extra[name] = value
    if extra:
        merged["sync_options"] = extra
    return merged


def check(space: list[Param], fixed: Mapping[str, Any], verify=None) -> None:
    """Each value a trial may get, with the fixed options, passes the trainer's validation
    (``verify(config dict)``, by default the checks that need no data): a search whose ranges
    include a refused value fails now, in one line, not in a trial."""
    verify = verify or (lambda cfg: validate(TrainConfig.from_dict(cfg)))
    for param in space:
        if _is_option(param.name) and _never_drawn(param, space, fixed):
            owners = ", ".join(sync.options()[param.name][1])
            raise UsageError(f"{param.name} is an option of --sync {owners}, which no trial "
                             "would use: search sync too, or fix it")
        for value in param.corners():
            trial = {p.name: (value if p is param else p.corners()[0]) for p in space}
            chosen = settings(space, fixed, lambda p: trial[p.name])
            try:
                verify(config(fixed, chosen))
            except UsageError as exc:
                if _refused_unsearched(fixed, verify, str(exc)):
                    raise  # every trial would meet it: the fixed options', not this range's
                raise UsageError(f"{param.describe()}: with {param.name}={clip(repr(value))}: "
                                 f"{exc}") \
                    from None


def _refused_unsearched(fixed: Mapping[str, Any], verify, message: str) -> bool:
    """Whether the fixed options alone, nothing searched, are refused in the same words."""
    try:
        verify(config(fixed, {}))
    except UsageError as exc:
        return str(exc) == message
    return False


def _never_drawn(param: Param, space: list[Param], fixed: Mapping[str, Any]) -> bool:
    """Whether no combination of the values it depends on (the strategy, an ``only_with``
    option) makes this strategy option apply."""
    option, _ = sync.options()[param.name]
    depends = ["sync"] + ([option.only_with[0]] if option.only_with else [])
    searched = {p.name: p.corners() for p in space}
    values = [searched.get(d, [fixed[d]] if d in fixed else [None]) for d in depends]
    for combo in itertools.product(*values):
        given = {d: v for d, v in zip(depends, combo) if v is not None}
        if sync.applies(param.name, {**fixed, **given}):
            return False
    return True
