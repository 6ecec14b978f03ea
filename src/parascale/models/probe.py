"""Checks on a built model: one forward pass on the input shape, and whether it has BatchNorm."""
from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from parascale.errors import UsageError

__all__ = ["probe", "has_batchnorm", "short_cause", "shape_error", "remember_name"]

# Image sizes tried, smallest first, to suggest an --image-size after a failed probe.
_SUGGESTED_SIZES = (8, 16, 28, 32, 64, 96, 128, 160, 224, 299)

# Names given to build(), so probe() can name the model the user asked for rather than its class.
_names: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()


def remember_name(model: nn.Module, name: str) -> None:
    """Record the name ``model`` was built from, for probe's messages."""
    _names[model] = name


def short_cause(exc: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message, whitespace-collapsed and cut to ``limit``."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shape_error(name: str, input_shape: Sequence[int], cause: str, size: int | None) -> UsageError:
    """The one-line error for a model that cannot handle ``input_shape``."""
    if cause.endswith(".") and not cause.endswith("..."):
        cause = cause[:-1]  # the hint follows after a semicolon
    message = f"model {name!r} does not accept inputs of shape {tuple(input_shape)}: {cause}"
    if size is not None:
        message += f"; try --image-size {size}"
    return UsageError(" ".join(message.split()))


def _forward_problem(
    model: nn.Module, input_shape: tuple[int, ...], num_classes: int
) -> str | None:
    """What goes wrong in an eval-mode forward pass of two zero inputs, or None if nothing does."""
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    # Restore each module's own flag: a caller may have frozen some parts in eval mode.
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()  # no BatchNorm statistics updated, no dropout randomness consumed
        with torch.no_grad():
            out = model(torch.zeros(2, *input_shape, device=device, dtype=dtype))
    except Exception as exc:  # any failure means the model cannot train on this shape
        return short_cause(exc)
    finally:
        for module, training in modes:
            module.training = training
    if not isinstance(out, torch.Tensor):
        return f"the output is a {type(out).__name__}, not a tensor of logits"
    if tuple(out.shape) != (2, num_classes):
        return f"the output has shape {tuple(out.shape)}, expected (2, {num_classes})"
    return None


def probe(
    model: nn.Module, input_shape: Sequence[int], num_classes: int, *, name: str | None = None
) -> None:
    """Run one forward pass on 2 zero inputs; raise UsageError unless it gives (2, num_classes).

    Catches a model/input mismatch in seconds, before any worker starts. The model's parameters
    and train/eval modes are left as they were. ``name`` defaults to the name the model was
    built from. When another square image size works, the message suggests it.
    """
    shape = tuple(int(s) for s in input_shape)
    cause = _forward_problem(model, shape, num_classes)
    if cause is None:
        return
    working = next(
        (s for s in _SUGGESTED_SIZES if (s, s) != shape[1:]
         and _forward_problem(model, (shape[0], s, s), num_classes) is None),
        None,
    )
    label = name or _names.get(model) or type(model).__name__
    raise shape_error(label, shape, cause, working)


def has_batchnorm(model: nn.Module) -> bool:
    """True if ``model`` has a BatchNorm layer, whose statistics depend on the per-worker batch."""
    # _BatchNorm also covers SyncBatchNorm and the lazy variants, unlike the public classes.
    return any(isinstance(m, _BatchNorm) for m in model.modules())
