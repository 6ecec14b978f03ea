"""User models given as ``package.module:function``."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from parascale.errors import UsageError, where
from parascale.models.probe import short_cause

if TYPE_CHECKING:
    from torch import nn

__all__ = ["resolve_user", "build_user"]


def resolve_user(spec: str, kind: str = "model") -> Callable[..., object]:
    """Import ``package.module`` from ``package.module:function`` and return the callable.

    The current directory is put on ``sys.path`` (at the end, so a local file cannot shadow an
    installed package) because the console script does not do that, unlike ``python -m``.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise UsageError(f"{kind} {spec!r}: expected 'package.module:function'")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    importlib.invalidate_caches()  # the file may have been written after the last import
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(
                f"{kind} {spec!r}: module {module_name!r} not found in the current directory "
                f"({cwd}) or on PYTHONPATH"
            ) from None
        raise UsageError(
            f"{kind} {spec!r}: importing {module_name!r} failed: {short_cause(exc)}"
        ) from exc
    except (Exception, SystemExit) as exc:  # a broken user module: which and why, one line
        raise UsageError(
            f"{kind} {spec!r}: importing {module_name!r} failed: "
            f"{type(exc).__name__}: {short_cause(exc)}"
        ) from exc
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{kind} {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(
            f"{kind} {spec!r}: {attr!r} in module {module_name!r} is a "
            f"{type(target).__name__}, not a function"
        )
    return target


def build_user(spec: str, num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    """Call the user's function as ``function(num_classes=K, input_shape=(C, H, W))``.

    Runs in preflight, before any worker starts, so whatever the function does wrong (raises,
    exits, returns something with nothing to train) is one line naming it, what it did and
    where; in a worker it would be a traceback per rank, or DDP's error about parameters.
    """
    function = resolve_user(spec)
    kwargs = {"num_classes": num_classes, "input_shape": input_shape}
    try:
        inspect.signature(function).bind(**kwargs)
    except TypeError as exc:
        raise UsageError(
            f"model {spec!r} must accept keyword arguments num_classes and input_shape: {exc}"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): let the call decide
        pass
    call = f"{spec.partition(':')[2]}(num_classes={num_classes}, input_shape={input_shape})"
    try:
        model = function(**kwargs)
    except SystemExit as exc:  # sys.exit(0) would end parascale silently, with exit code 0
        raise UsageError(f"model {spec!r}: {call} exited (SystemExit({exc.code!r})) instead of "
                         f"returning a model{where(exc)}") from None
    except Exception as exc:
        raise UsageError(f"model {spec!r}: {call} raised {type(exc).__name__}: "
                         f"{short_cause(exc)}{where(exc)}") from exc
    from torch import nn

    if not isinstance(model, nn.Module):
        raise UsageError(
            f"model {spec!r} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError(f"model {spec!r}: {call} returned a {type(model).__name__} without "
                         "trainable parameters (none that requires a gradient): nothing to train")
    return model
