"""A strategy's options: declared once, as the fields of its typed ``Settings``.

A strategy lists its options in its own file, as a frozen dataclass of settings whose every
field is made by :func:`option` (its default, help, choices, minimum...); the strategy reads
them typed (``self.settings.period``), and the registry (sync/__init__.py) reads the same
declarations as :class:`Option` for the command line, ``bench``, ``hpo``, validation and the
record. Adding a strategy touches its file and one registry line.

Where the values live: ``TrainConfig.strategy.sync_options``, one mapping of option name to
value, read from ``--sync-option NAME=VALUE``, from an option's own flag (``flag=True``: the
built-in strategies' options, which had flags before --sync-option existed), from a study file
or a record (each option a top-level key of the record's ``config``).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from parascale import checks
from parascale.errors import UsageError

_DECLARED = "parascale.option"  # the key of a field's metadata that holds its declaration


@dataclass(frozen=True)
class Option:
    """One option of a strategy, as the registry shows it."""

    name: str
    help: str
    #: the value's type: int, float, str, bool, or a union (``learners``: a count or "auto")
    kind: Any
    default: Any
    choices: Sequence[str] = ()
    #: smallest allowed value of a number (1 for counts)
    minimum: float | None = None
    #: (option, value): this option means something only when that option has that value
    #: (--powersgd-rank with --compression powersgd)
    only_with: tuple[str, Any] | None = None
    #: given as a flag of its own (``--period 4``) rather than as ``--sync-option period=4``
    flag: bool = False

    @property
    def spelled(self) -> str:
        """How a user gives it: ``--period`` or ``--sync-option stage``."""
        return "--" + self.name.replace("_", "-") if self.flag else f"--sync-option {self.name}"

    def given(self, value: Any) -> str:
        """It given with ``value``: ``--period 4`` or ``--sync-option stage=2``."""
        return f"{self.spelled} {value}" if self.flag else f"{self.spelled}={value}"

    def holds(self, value_of: Callable[[str], Any]) -> bool:
        """Whether ``only_with`` holds, reading the other option's value with ``value_of``."""
        if self.only_with is None:
            return True
        other, wanted = self.only_with
        return bool(value_of(other) == wanted)

    def check(self, value: Any) -> None:
        """One line for a value this option refuses."""
        words, fits = _expected(self.kind)
        if not fits(value):
            raise UsageError(f"{self.spelled} must be {words}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{self.spelled} must be a finite number, got {value}")
        if self.choices and value not in self.choices:
            raise UsageError(f"{self.spelled} must be one of {', '.join(self.choices)}, "
                             f"got {value!r}")
        if self.minimum == 1 and checks.is_int(value) and value < 1:  # config's words for counts
            raise UsageError(f"{self.spelled} must be a positive int, got {value!r}")
        if self.minimum is not None and isinstance(value, (int, float)) and value < self.minimum:
            raise UsageError(f"{self.spelled} must be at least {self.minimum:g}, got {value!r}")


def option(default: Any, help: str, *, choices: Sequence[str] = (), minimum: float | None = None,
           only_with: tuple[str, Any] | None = None, flag: bool = False) -> Any:
    """A field of a strategy's ``Settings``: its default and what the registry shows of it (the
    field's annotation is its kind)."""
    return dataclasses.field(default=default, metadata={_DECLARED: {
        "help": " ".join(help.split()), "choices": tuple(choices), "minimum": minimum,
        "only_with": only_with, "flag": flag}})


S = TypeVar("S", bound="Settings")


@dataclass(frozen=True)
class Settings:
    """A strategy's options, typed; this base declares none (a strategy without options)."""

    @classmethod
    def declared(cls) -> tuple[Option, ...]:
        """Every option, in declaration order (inherited ones first)."""
        return _declared(cls)

    @classmethod
    def of(cls: type[S], given: Mapping[str, Any]) -> S:
        """The settings ``given`` (a mapping of option names, as
        ``TrainConfig.strategy.sync_options``) chooses; what it leaves out takes its default,
        names of other strategies are passed over. The values are taken as they are:
        :func:`parascale.sync.validate` checks them."""
        return cls(**{o.name: given[o.name] for o in cls.declared() if o.name in given})

    def values(self) -> dict[str, Any]:
        """Every option with its value."""
        return {o.name: getattr(self, o.name) for o in self.declared()}

    def applying(self) -> dict[str, Any]:
        """The options that mean something here (``only_with`` holds), with their values."""
        return {o.name: getattr(self, o.name) for o in self.declared()
                if o.holds(lambda other: getattr(self, other))}

    def changed(self) -> list[str]:
        """The options set away from their defaults, as a user gives them (``--period 4``)."""
        return [o.given(getattr(self, o.name)) for o in self.declared()
                if getattr(self, o.name) != o.default]


_SEEN: dict[type, tuple[Option, ...]] = {}


def _declared(cls: type[Settings]) -> tuple[Option, ...]:
    if cls in _SEEN:
        return _SEEN[cls]
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if _DECLARED not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name}: declare a strategy's option with "
                            "parascale.sync.options.option(default, help, ...)")
        found.append(Option(f.name, kind=_kind(hints[f.name]), default=f.default,
                            **f.metadata[_DECLARED]))
    _SEEN[cls] = tuple(found)
    return _SEEN[cls]


def _kind(annotation: Any) -> Any:
    """``int | str`` as ``typing.Union[int, str]``, which :func:`checks.expected` reads."""
    if isinstance(annotation, types.UnionType):
        return typing.Union[typing.get_args(annotation)]
    return annotation


def _expected(kind: Any) -> tuple[str, Callable[[Any], bool]]:
    """The words and the test of a declared kind: the configuration's for its types, an
    isinstance test for any other class a strategy of one's own declares."""
    try:
        return checks.expected(kind)
    except TypeError:
        return kind.__name__, lambda value: isinstance(value, kind)
