"""What a strategy says about one of its options; the registry gathers them (sync/__init__.py).

A strategy lists its options in its own file (``Strategy.declares``), so that adding a strategy
touches that file and one registry line: ``train``'s flags and help, ``bench``, validation and
the record all read the declarations through the registry.

Where the value lives: the options of the built-in strategies are ``TrainConfig`` fields (their
names are in every record and study, so they stay), which give their type and default; an option
that is not a field declares ``kind`` and ``default`` here and travels in
``TrainConfig.sync_options`` (``--sync-option name=value``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from parascale import checks
from parascale.errors import UsageError


@dataclass(frozen=True)
class Option:
    name: str
    help: str
    choices: Sequence[str] = ()
    #: smallest allowed value of a number (1 for counts)
    minimum: float | None = None
    #: (option, value): this option means something only when that option has that value
    #: (--powersgd-rank with --compression powersgd)
    only_with: tuple[str, Any] | None = None
    #: for options that are not TrainConfig fields: their type and default
    kind: type | None = None
    default: Any = None

    def value(self, cfg: Any) -> Any:
        """This option's value in a TrainConfig: its field, or its entry of sync_options."""
        if self.kind is None:
            return getattr(cfg, self.name)
        return cfg.sync_options.get(self.name, self.default)

    def default_in(self, cfg: Any) -> Any:
        if self.kind is None:
            return next(f.default for f in dataclasses.fields(cfg) if f.name == self.name)
        return self.default

    def applies(self, cfg: Any) -> bool:
        """False when ``only_with`` names another option's value that is not the one given."""
        return self.holds(lambda other: getattr(cfg, other, cfg.sync_options.get(other)))

    def holds(self, value_of: Callable[[str], Any]) -> bool:
        """Whether ``only_with`` holds, reading the other option's value with ``value_of``."""
        if self.only_with is None:
            return True
        other, wanted = self.only_with
        return value_of(other) == wanted

    def check(self, value: Any) -> None:
        """One line for a value this option refuses."""
        flag = f"--{self.name.replace('_', '-')}"
        if self.kind is not None:
            words, fits = _expected(self.kind)
            if not fits(value):
                raise UsageError(f"{flag} must be {words}, got {value!r}")
        if self.choices and value not in self.choices:
            raise UsageError(f"{flag} must be one of {', '.join(self.choices)}, got {value!r}")
        if self.minimum == 1 and isinstance(value, int):
            checks.positive(self.name, value, allow_none=False)  # config's wording for counts
        if self.minimum is not None and value < self.minimum:
            raise UsageError(f"{flag} must be at least {self.minimum:g}, got {value!r}")


def _expected(kind: type) -> tuple[str, Callable[[Any], bool]]:
    """The words and the test of a declared kind: the configuration's for its types, an
    isinstance test for any other class a strategy of one's own declares."""
    try:
        return checks.expected(kind)
    except TypeError:
        return kind.__name__, lambda value: isinstance(value, kind)
