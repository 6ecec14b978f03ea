"""A user's task, ``--task package.module:function``: imported with importlib (never eval),
called, and checked before any worker starts, so that whatever is wrong with it is one line
naming the call and what was expected (exit 2), not a traceback per rank.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from parascale.errors import UsageError, where
from parascale.models.probe import short_cause
from parascale.models.user import resolve_user
from parascale.tasks.base import LOSS, Metric, Task, samples_in


def _call(spec: str) -> str:
    return f"task {spec!r}: {spec.partition(':')[2]}()"


def load(spec: str, seed: int) -> Task:
    """Call the function of ``spec`` (torch seeded with ``seed`` first, so that data it draws at
    random is the same on every rank) and check what it returned."""
    function = resolve_user(spec, kind="task")
    call = _call(spec)
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
    if len(value) == 0:
        raise UsageError(f"{call}: {what} is empty; it needs at least one sample")


def check(task: Task, call: str) -> None:
    """The task's fields have the types the trainer needs (no data is read here)."""
    _dataset(task.train_data, "train_data", call)
    _dataset(task.eval_data, "eval_data", call)
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
        if not isinstance(metric.name, str) or not metric.name.isidentifier():
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
    if not isinstance(task.unit, str) or not task.unit:
        raise UsageError(f"{call}: unit is {task.unit!r}; expected a word such as 'samples' "
                         "or 'tokens'")
    per = task.units_per_sample
    if isinstance(per, bool) or not isinstance(per, (int, float)) or not math.isfinite(per) \
            or per <= 0:
        raise UsageError(f"{call}: units_per_sample is {per!r}; expected a positive number "
                         f"(the {task.unit} in one sample)")


def _scalar(value: Any, what: str, call: str) -> float:
    """``value`` as a finite float, or one line saying what it was."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        number = float(value.detach())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
        raise UsageError(f"{call}: {what} returned a {type(value).__name__}{shape}; expected a "
                         "scalar (a tensor with one element, the mean over the batch)")
    if not math.isfinite(number):
        raise UsageError(f"{call}: {what} returned {number} on the first batch; expected a "
                         "finite number")
    return number


def _tried(call: str, what: str, function, *args) -> Any:
    """``function(*args)`` of the user's task, or one line saying what it raised. An exit
    (``sys.exit`` in the user's code) is one line too: it would end parascale silently with the
    user's exit code, where 0 reads as success. Ctrl-C (KeyboardInterrupt) still interrupts."""
    try:
        return function(*args)
    except SystemExit as exc:
        raise _exited(call, what, exc) from None
    except Exception as exc:
        raise UsageError(f"{call}: {what} raised {type(exc).__name__}: {short_cause(exc)}"
                         f"{where(exc)}") from exc


def _exited(call: str, what: str, exc: SystemExit) -> UsageError:
    return UsageError(f"{call}: {what} exited (SystemExit({exc.code!r})){where(exc)}; a "
                      "task's functions return or raise, never exit")


def probe(task: Task, call: str, split, eval_split) -> None:
    """Build the model and run the loss (with a backward) on the first two training samples and
    every metric on the first two evaluation samples, on the CPU, so that a collate that cannot
    batch the items, a loss that is not a finite scalar or a broken metric is one line here."""
    model = _tried(call, "model()", task.model)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{call}: model() returned a {type(model).__name__}; expected a "
                         "torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError(f"{call}: model() returned a {type(model).__name__} without trainable "
                         "parameters: nothing to train")
    batch = _first(split, "train_data", call)
    loss = _tried(call, "loss(model, batch)", task.loss, model, batch)
    _scalar(loss, "loss(model, batch)", call)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise UsageError(f"{call}: loss(model, batch) returned a value without a gradient; "
                         "expected a tensor computed from the model's output")
    loss.backward()
    model.eval()
    batch = _first(eval_split, "eval_data", call)
    with torch.no_grad():
        for metric in task.metrics:
            value = _tried(call, f"metric {metric.name!r}", metric.fn, model, batch)
            _scalar(value, f"metric {metric.name!r}", call)


def _first(split, what: str, call: str) -> Any:
    """The first two samples of ``split`` as one batch on the CPU."""
    indices = torch.arange(min(2, len(split)))
    try:
        batch = next(iter(split.batches([indices], torch.device("cpu"), train=True)))
    except SystemExit as exc:
        raise _exited(call, f"batching the items of {what}", exc) from None
    except Exception as exc:
        raise UsageError(f"{call}: the items of {what} cannot be batched: "
                         f"{type(exc).__name__}: {short_cause(exc)}; items must be tensors, "
                         "tuples or dicts of tensors of one shape, or give a collate") from exc
    if samples_in(batch) == 0:
        raise UsageError(f"{call}: a batch of {what} holds no tensor; items must be tensors, "
                         "tuples or dicts of tensors")
    return batch
