"""Command-line options generated from :class:`TrainConfig`, so there is one source of truth.

Each field becomes ``--field-name`` with the docstring under the field as its help; types come
from the annotations. The strategies' options take help and choices from their declarations
(``sync.options()``): those with a flag of their own get it, and ``--sync-option``'s help lists
the others; --sync's help lists the registry's strategies. Only
options the user typed reach the namespace (``SUPPRESS`` defaults), which lets ``bench`` tell a
fixed parameter from a default.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import typing
from typing import Any

from parascale import config as config_module
from parascale import sync
from parascale.bench.values import parse_value
from parascale.checks import path_option
from parascale.config import NAMES, SECTIONS, field_kinds
from parascale.digits import INT_RE, ascii_type, int_list

# help groups: one per section of the configuration, in its order
TITLES = {
    "job": "what to train", "data": "the data", "processes": "where to train",
    "batch": "batch and length", "optim": "optimisation", "strategy": "synchronisation and speed",
    "evaluation": "evaluation and targets", "measure": "measurement", "output": "output",
    "checkpoint": "checkpoints and restarts",
}
CHOICES = {
    "lr_scaling": config_module.LR_SCALINGS, "lr_schedule": config_module.LR_SCHEDULES,
    "precision": config_module.PRECISIONS, "backend": config_module.BACKENDS,
    "device": config_module.DEVICES, "optimizer": config_module.OPTIMIZERS,
}
PATHS = ("out", "tensorboard", "data_dir")  # folders: an empty one is refused at once
METAVARS = {"gpus": "0,1,...", "synthetic_shape": "C,H,W", "lr_milestones": "E1,E2,...",
            "workers": "N", "model": "NAME", "dataset": "NAME", "sync": "NAME",
            "learners": "M|auto", "task": "MODULE:FUNCTION", "device_memory": "SIZE"}


@functools.cache
def field_docs() -> dict[str, str]:
    """The docstring written under each setting, in its section (plain text, one line)."""
    docs = {}
    for section in SECTIONS.values():
        body = ast.parse(inspect.getsource(section)).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                    and isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int_list(text: str) -> tuple[int, ...]:
    values = int_list(text, "integers")
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _count_or_word(text: str) -> int | str:
    """An integer when the text is one (``--learners 4``), else the word (``--learners auto``).

    Digits other than ASCII ('４') are refused here: as a word they would reach the option's
    check as 'not auto', as int() they would be read as a count no one typed."""
    text = text.strip()
    if INT_RE.fullmatch(text):
        return int(text)
    if any(c.isdigit() for c in text) and not text.isascii():
        raise argparse.ArgumentTypeError(f"expected a whole number in ASCII digits (0-9) or a "
                                         f"word, got {text!r}")
    return text


def key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), parse_value(value)


def add_train_options(parser: argparse.ArgumentParser, sections: bool = True,
                      exclude: set[str] | frozenset[str] = frozenset()) -> None:
    """Add one option per setting, a group per section of the configuration (TITLES), and one
    per strategy option that has a flag of its own (after --sync); none for a name in
    ``exclude``."""
    declared = sync.options()
    docs = {**field_docs(), "sync": sync_help(sync.names()),
            "sync_options": field_docs().get("sync_options", "") + _extra_options(declared)}
    for section, kind in SECTIONS.items():
        group: Any = parser.add_argument_group(TITLES[section]) if sections else parser
        for field in dataclasses.fields(kind):
            _add_setting(group, field, declared, docs, exclude)


def _add_setting(group: Any, field: dataclasses.Field, declared: dict[str, Any],
                 docs: dict[str, str], exclude: set[str] | frozenset[str]) -> None:
    if field.name == "sync_options":
        for name, (opt, _) in declared.items():
            if opt.flag and name not in exclude:
                _add(group, name, opt.kind, opt.default, sync.help_of(name), opt.choices)
    if field.name in exclude:
        return
    kind, _ = field_kinds()[field.name]
    default = field.default if field.default is not dataclasses.MISSING else \
        field.default_factory()  # type: ignore[misc, operator]
    _add(group, field.name, kind, default, docs.get(field.name, ""),
         CHOICES.get(field.name))


def sync_help(names: list[str]) -> str:
    """--sync's help: the strategies the registry holds (``names``: those a command takes)."""
    baseline = f"; {sync.BASELINE}: no exchange, the contention baseline" \
        if sync.BASELINE in names else ""
    return (f"Synchronisation strategy: {', '.join(names)} (default: {sync.DEFAULT}{baseline}); "
            "or package.module:Class, a parascale.sync.Strategy of your own. See "
            "docs/strategies.md.")


def _add(group: Any, name: str, kind: Any, default: Any, text: str,
         choices: Any = None) -> None:
    """One option: ``--name`` of type ``kind`` (``sync_options``: ``--sync-option K=V``)."""
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    text = text.replace("%", "%%")  # argparse formats help with %
    if default not in (None, (), {}, False):
        text += f" (default: {shown})"
    common = {"dest": name, "default": argparse.SUPPRESS, "help": text}
    if kind is bool:
        group.add_argument(flag(name), action=argparse.BooleanOptionalAction, **common)
    elif typing.get_origin(kind) is tuple:
        group.add_argument(flag(name), type=_int_list, metavar=METAVARS.get(name, "N,..."),
                           **common)
    elif typing.get_origin(kind) is typing.Union:
        group.add_argument(flag(name), type=_count_or_word, metavar=METAVARS.get(name, "VALUE"),
                           **common)
    elif typing.get_origin(kind) is dict:
        group.add_argument("--sync-option", type=key_value, action="append",
                           metavar="KEY=VALUE", **common)
    elif name in PATHS:
        group.add_argument(flag(name), type=path_option(flag(name)), metavar="DIR", **common)
    else:
        group.add_argument(flag(name), type=ascii_type(kind), choices=choices or None,
                           metavar=METAVARS.get(name, None if choices else kind.__name__.upper()),
                           **common)


def _extra_options(declared: dict[str, tuple[sync.Option, list[str]]]) -> str:
    """' Declared: NAME (--sync S, type, default D): help; ...' for --sync-option's help: the
    options without a flag of their own (every option may be given this way)."""
    extra = [f"{name} (--sync {', '.join(owners)}, {getattr(o.kind, '__name__', o.kind)}, "
             f"default {o.default!r}): {o.help}" for name, (o, owners) in declared.items()
             if not o.flag]
    return (" Declared: " + "; ".join(extra)) if extra else " None is declared now."


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields the user gave, as a dict (``sync_options`` from KEY=VALUE pairs)."""
    names = set(NAMES) | set(sync.options())
    given = {k: v for k, v in vars(args).items() if k in names}
    if "sync_options" in given:
        given["sync_options"] = dict(given["sync_options"])
    return given
