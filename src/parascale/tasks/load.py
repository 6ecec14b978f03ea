"""A user's task, ``--task package.module:function``: imported with importlib (never eval),
called, and its fields checked before any worker starts (then tried: :mod:`.tryout`), so that
whatever is wrong with it is one line naming the call and what was expected (exit 2), not a
traceback per rank.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.errors import UsageError, where
from parascale.models.probe import short_cause
from parascale.models.user import resolve_user
from parascale.tasks.base import LOSS, Metric, Task, check_name
from parascale.tasks.tryout import tried

if TYPE_CHECKING:
    import torch
else:  # a task that cannot be imported is refused before torch is: one line at once
    torch = lazy.module("torch", globals())


def call_of(spec: str) -> str:
    """How one-line errors name the task: "task 'm:f': f()"."""
    return f"task {spec!r}: {spec.partition(':')[2]}()"


def load(spec: str, seed: int) -> Task:
    """Call the function of ``spec`` (torch seeded with ``seed`` first, so that data it draws at
    random is the same on every rank) and check what it returned."""
    function = resolve_user(spec, kind="task")
    call = call_of(spec)
    torch.manual_seed(seed)
    try:
        task = function()
    except SystemExit as exc:
        raise UsageError(f"{call} exited (SystemExit({exc.code!r})) instead of returning a "
                         f"parascale.tasks.Task{where(exc)}") from None
    except Exception as exc:
        raise UsageError(f"{call} raised {type(exc).__name__}: {short_cause(exc)}"
                         f"{where(exc)}") from exc
    if not isinstance(task, Task):
        raise UsageError(f"{call} returned a {type(task).__name__}; expected a "
                         "parascale.tasks.Task (see docs/tasks.md)")
    check(task, call)
    return task


def _dataset(value: Any, what: str, call: str) -> None:
    if not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        raise UsageError(f"{call}: {what} is a {type(value).__name__}; expected a map-style "
                         "torch.utils.data.Dataset (with __len__ and __getitem__)")
    # len() raises for a __len__ that raises, gives no int or a negative one
    if tried(call, f"{what}: len()", len, value,
             hint="__len__ gives the number of samples, an int of 0 or more") == 0:
        raise UsageError(f"{call}: {what} is empty; it needs at least one sample")


def check(task: Task, call: str) -> None:
    """The task's fields have the types the trainer needs (no data is read here)."""
    _dataset(task.train_data, "train_data", call)
    _dataset(task.eval_data, "eval_data", call)
    if isinstance(task.model, torch.nn.Module):  # callable, but called with no input
        raise UsageError(f"{call}: model is a {type(task.model).__name__} module; expected a "
                         "function that returns one (each worker builds its own), e.g. "
                         "model=lambda: nn.Sequential(...)")
    if isinstance(task.loss, torch.nn.Module):
        raise UsageError(f"{call}: loss is a {type(task.loss).__name__} module; expected "
                         "loss(model, batch), a function that runs the model on the batch and "
                         "returns its loss")
    for name in ("model", "loss"):
        if not callable(getattr(task, name)):
            raise UsageError(f"{call}: {name} is a {type(getattr(task, name)).__name__}; "
                             "expected a function")
    for name in ("collate", "optimizer"):
        if getattr(task, name) is not None and not callable(getattr(task, name)):
            raise UsageError(f"{call}: {name} is a {type(getattr(task, name)).__name__}; "
                             "expected a function or None")
    if not isinstance(task.metrics, (list, tuple)):
        raise UsageError(f"{call}: metrics is a {type(task.metrics).__name__}; expected a list "
                         "of parascale.tasks.Metric")
    names = [LOSS]
    for metric in task.metrics:
        if not isinstance(metric, Metric):
            raise UsageError(f"{call}: metrics holds a {type(metric).__name__}; expected "
                             "parascale.tasks.Metric(name, fn, higher_is_better)")
        check_name(metric.name, f"{call}: metric name")
        if not metric.name.isidentifier():
            raise UsageError(f"{call}: metric name {metric.name!r} is not a plain name "
                             "(letters, digits, underscores; e.g. 'mae')")
        if not isinstance(metric.higher_is_better, bool):
            raise UsageError(f"{call}: metric {metric.name!r} has no direction: give "
                             "higher_is_better=True (accuracy) or False (an error)")
        if not callable(metric.fn):
            raise UsageError(f"{call}: metric {metric.name!r}'s fn is not a function")
        if metric.name in names:
            raise UsageError(f"{call}: metric {metric.name!r} is named twice (the loss is "
                             f"always the metric {LOSS!r}); give each a name of its own")
        names.append(metric.name)
    if task.judge is not None and task.judge not in names:
        raise UsageError(f"{call}: judge {task.judge!r} is not one of its metrics "
                         f"({', '.join(names)})")
    check_name(task.name, f"{call}: name", "regression")
    check_name(task.unit, f"{call}: unit", "tokens")
    per = task.units_per_sample
    if isinstance(per, bool) or not isinstance(per, (int, float)) or not math.isfinite(per) \
            or per <= 0:
        raise UsageError(f"{call}: units_per_sample is {per!r}; expected a positive number "
                         f"(the {task.unit} in one sample)")
