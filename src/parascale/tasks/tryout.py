"""A user's task tried before any worker starts: the model built, the loss with a backward on
the first two training samples, the optimizer stepped once, every metric on the first two
evaluation samples, on the CPU. Whatever of it is wrong is one line naming the call and what
was expected (exit 2), not a traceback per rank, or DDP's error at the second step.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.errors import UsageError, where
from parascale.models.probe import short_cause
from parascale.tasks.base import Task, samples_in

if TYPE_CHECKING:
    import torch
else:  # imported by tasks.load, which refuses a task it cannot import before torch is needed
    torch = lazy.module("torch", globals())

SHOWN = 4  # parameters named of those without a gradient


def tried(call: str, what: str, function, *args, hint: str = "") -> Any:
    """``function(*args)`` of the user's task, or one line saying what it raised (and
    ``hint``, what would be right). An exit (``sys.exit`` in the user's code) is one line too:
    it would end parascale silently with the user's exit code, where 0 reads as success.
    Ctrl-C (KeyboardInterrupt) still interrupts."""
    try:
        return function(*args)
    except SystemExit as exc:
        raise exited(call, what, exc) from None
    except Exception as exc:
        raise UsageError(f"{call}: {what} raised {type(exc).__name__}: {short_cause(exc)}"
                         f"{where(exc)}{'; ' + hint if hint else ''}") from exc


def exited(call: str, what: str, exc: SystemExit) -> UsageError:
    return UsageError(f"{call}: {what} exited (SystemExit({exc.code!r})){where(exc)}; a "
                      "task's functions return or raise, never exit")


def run(task: Task, call: str, split, eval_split, lr: float) -> torch.nn.Module:
    """Try the task on the first samples of ``split`` and ``eval_split`` (see the module);
    the model it tried."""
    model = tried(call, "model()", task.model)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{call}: model() returned a {type(model).__name__}; expected a "
                         "torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError(f"{call}: model() returned a {type(model).__name__} without trainable "
                         "parameters: nothing to train")
    batch = _first(split, "train_data", call)
    loss = tried(call, "loss(model, batch)", task.loss, model, batch)
    _loss_value(loss, call)
    tried(call, "the backward of loss(model, batch)", loss.backward)
    _all_gradients(model, call)
    if task.optimizer is not None:
        _optimizer(task, model, lr, call)
    model.eval()
    batch = _first(eval_split, "eval_data", call)
    with torch.no_grad():
        for metric in task.metrics:
            value = tried(call, f"metric {metric.name!r}", metric.fn, model, batch)
            _scalar(value, f"metric {metric.name!r}", call)
    return model


def _loss_value(loss: Any, call: str) -> None:
    """The loss is what the trainer needs: a finite real tensor of shape () with a gradient
    (a shape (1, 1) passed a one-element check, then failed in the trainer's sums)."""
    what = "loss(model, batch)"
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.ndim:
        raise UsageError(f"{call}: {what} returned a tensor of shape {tuple(loss.shape)}; "
                         "expected a scalar tensor of shape () (the mean over the batch), "
                         "e.g. .mean() or .reshape(())")
    _scalar(loss, what, call)
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise UsageError(f"{call}: {what} returned a value without a gradient; expected a "
                         "tensor computed from the model's output")


def _scalar(value: Any, what: str, call: str) -> float:
    """``value`` as a finite float, or one line saying what it was."""
    if isinstance(value, torch.Tensor) and value.is_complex():
        raise UsageError(f"{call}: {what} returned a complex tensor; expected a real number "
                         "(e.g. its .abs() or .real)")
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        number = float(value.detach())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # a Python int beyond a float's range
            raise UsageError(f"{call}: {what} returned an int too large for a float "
                             f"({len(str(abs(value)))} digits); expected the mean over the "
                             "batch's samples") from None
    else:
        shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
        raise UsageError(f"{call}: {what} returned a {type(value).__name__}{shape}; expected a "
                         "scalar (a tensor with one element, the mean over the batch)")
    if not math.isfinite(number):
        raise UsageError(f"{call}: {what} returned {number} on the first batch; expected a "
                         "finite number")
    return number


def _all_gradients(model: torch.nn.Module, call: str) -> None:
    """Every trainable parameter got a gradient from the loss: DDP waits for each one's, and a
    parameter the loss never reaches stops 2 workers at the second step ("Expected to have
    finished reduction in the prior iteration")."""
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
        raise UsageError(f"{call}: the model's parameters {', '.join(missing[:SHOWN])}{more} "
                         "got no gradient from loss(model, batch) on the first batch; "
                         "data-parallel training needs every trainable parameter in the loss: "
                         "use them, or freeze them with requires_grad_(False)")


def _optimizer(task: Task, model: torch.nn.Module, lr: float, call: str) -> None:
    """The task's own optimizer is built from the model's parameters and steps once."""
    what = "optimizer(params, lr)"
    optimizer = tried(call, what, task.optimizer, list(model.parameters()), lr)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"{call}: {what} returned a {type(optimizer).__name__}; expected a "
                         "torch.optim.Optimizer over the given parameters")
    tried(call, "the optimizer's step()", optimizer.step)


def _first(split, what: str, call: str) -> Any:
    """The first two samples of ``split`` as one batch on the CPU, after a batch of three has
    counted its samples too (two alone could match a first tensor of two rows by chance)."""
    if len(split) >= 3:
        _batch(split, 3, what, call)
    return _batch(split, min(2, len(split)), what, call)


def _batch(split, items: int, what: str, call: str) -> Any:
    """The first ``items`` samples of ``split`` as one batch on the CPU, which must count that
    many samples: throughput, the train loss and every metric's mean weigh batches by it."""
    try:
        batch = next(iter(split.batches([torch.arange(items)], torch.device("cpu"),
                                        train=True)))
    except SystemExit as exc:
        raise exited(call, f"batching the items of {what}", exc) from None
    except Exception as exc:
        raise UsageError(f"{call}: the items of {what} cannot be batched: "
                         f"{type(exc).__name__}: {short_cause(exc)}; items must be tensors, "
                         "tuples or dicts of tensors of one shape, or give a collate") from exc
    counted = samples_in(batch)
    if counted == 0:
        raise UsageError(f"{call}: a batch of {what} holds no tensor; items must be tensors, "
                         "tuples or dicts of tensors")
    if counted != items:
        raise UsageError(f"{call}: a batch of {items} items of {what} counts {counted} samples: "
                         "parascale counts a batch's samples by the first dimension of its "
                         "first tensor; collate each batch so that its first tensor has one "
                         "row per item (the inputs first)")
    return batch
