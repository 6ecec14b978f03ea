"""Checks on a built model: one forward pass on the input shape and one training step's, and
whether it has BatchNorm."""
from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from parascale import lazy
from parascale.errors import UsageError
from parascale.models.timm_models import is_timm

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # the registry's names and checks are read without torch (the command line's errors)
    torch = lazy.module("torch", globals())
    nn = lazy.module("torch.nn", globals())

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


def _zeros(model: nn.Module, input_shape: tuple[int, ...]) -> torch.Tensor:
    """Two zero inputs on the model's device, in its floating dtype (token ids for a shape (T,))."""
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    return torch.zeros(2, *input_shape, device=device,
                       dtype=torch.long if len(input_shape) == 1 else dtype)


def _forward_problem(
    model: nn.Module, input_shape: tuple[int, ...], num_classes: int
) -> str | None:
    """What goes wrong in an eval-mode forward pass of two zero inputs, or None if nothing does."""
    # Restore each module's own flag: a caller may have frozen some parts in eval mode.
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()  # no BatchNorm statistics updated, no dropout randomness consumed
        with torch.no_grad():
            out = model(_zeros(model, input_shape))
    except Exception as exc:  # noqa: BLE001 - any failure means the model cannot train on this shape
        return short_cause(exc)
    finally:
        for module, training in modes:
            module.training = training
    return _output_problem(out, num_classes, input_shape)


def _output_problem(out: object, num_classes: int, input_shape: tuple[int, ...]) -> str | None:
    if not isinstance(out, torch.Tensor):
        return f"the output is a {type(out).__name__}, not a tensor of logits"
    # token sequences (T,): logits for every position
    expected = (2, *input_shape, num_classes) if len(input_shape) == 1 else (2, num_classes)
    if tuple(out.shape) != expected:
        return f"the output has shape {tuple(out.shape)}, expected {expected}"
    return None


def _training_problem(
    model: nn.Module, input_shape: tuple[int, ...], num_classes: int
) -> str | None:
    """What goes wrong in one training-mode forward and backward of two zero inputs (what a
    worker's first step does), or None. Nothing of it stays: modes, buffers (BatchNorm's
    statistics), gradients and the global random state are put back."""
    modes = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    grads = [(p, p.grad) for p in model.parameters()]
    try:
        with torch.random.fork_rng(devices=[]):  # dropout draws from the global generator
            model.train()
            out = model(_zeros(model, input_shape))
            problem = _output_problem(out, num_classes, input_shape)
            if problem:
                return f"in training mode {problem}"
            if not out.requires_grad:
                return ("its output does not depend on a trainable parameter (detached?): no "
                        "gradient would flow back")
            target = torch.zeros(out.shape[:-1], dtype=torch.long, device=out.device)
            nn.functional.cross_entropy(out.flatten(0, -2).float(), target.flatten()).backward()
    except Exception as exc:  # noqa: BLE001 - the step a worker would fail in, with a traceback per rank
        return f"a training step fails: {short_cause(exc)}"
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for parameter, grad in grads:
            parameter.grad = grad
        for module, training in modes:
            module.training = training
    return None


def _signature_problem(model: nn.Module) -> str | None:
    """Why ``model(batch)`` cannot be called with one batch, judged by forward's signature."""
    try:
        inspect.signature(model.forward).bind(torch.zeros(0))
    except TypeError as exc:
        return f"its forward must take one argument, a batch of inputs (N, C, H, W): {exc}"
    except ValueError:  # no signature to inspect: the forward pass decides
        pass
    return None


def _users(model: nn.Module) -> bool:
    """Built from a user's ``package.module:function``. parascale's own models, torchvision's
    and timm's are known to train, and the training step costs seconds for the big ones (3.6 s
    for resnet50 at 224 px on one thread, 4x its eval forward)."""
    built = _names.get(model, "")
    return ":" in built and not is_timm(built)


def probe(
    model: nn.Module, input_shape: Sequence[int], num_classes: int, *, name: str | None = None,
    step: bool | None = None,
) -> None:
    """Run one forward pass on 2 zero inputs; raise UsageError unless it gives (2, num_classes)
    ((2, T, num_classes) for token sequences of shape (T,)), and then, with ``step`` (by
    default for a user's model), one training step's forward and backward (a tensor of logits
    in training mode too, that a gradient flows back through).

    Catches a model/input mismatch, or a model that cannot train (a forward taking other
    arguments, auxiliary outputs in training mode, a detached output), in seconds, before any
    worker starts. The model's parameters, buffers, gradients and train/eval modes are left as
    they were. ``name`` defaults to the name the model was built from. When another square
    image size works, the message suggests it.
    """
    shape = tuple(int(s) for s in input_shape)
    label = name or _names.get(model) or type(model).__name__
    wrong = _signature_problem(model)
    if wrong:
        raise UsageError(f"model {label!r}: {wrong}")
    cause = _forward_problem(model, shape, num_classes)
    if cause is None:
        trains = _users(model) if step is None else step
        untrainable = trains and _training_problem(model, shape, num_classes)
        if untrainable:
            raise UsageError(f"model {label!r} cannot be trained: {untrainable}")
        return
    working = None if len(shape) == 1 else next(
        (s for s in _SUGGESTED_SIZES if (s, s) != shape[1:]
         and _forward_problem(model, (shape[0], s, s), num_classes) is None),
        None,
    )
    raise shape_error(label, shape, cause, working)


def has_batchnorm(model: nn.Module) -> bool:
    """True if ``model`` has a BatchNorm layer, whose statistics depend on the per-worker batch."""
    from torch.nn.modules.batchnorm import _BatchNorm

    # _BatchNorm also covers SyncBatchNorm and the lazy variants, unlike the public classes.
    return any(isinstance(m, _BatchNorm) for m in model.modules())
