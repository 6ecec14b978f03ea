"""Model registry: a name resolves to a factory; nothing else in parascale knows model types.

A model name is one of

- parascale's own models (:func:`names`): ``mlp``, ``smallcnn``, ``lenet`` (no BatchNorm, so
  data-parallel runs match one worker exactly), the CIFAR ResNets ``resnet20/32/56`` and ``gpt``
  (a decoder for token data: input shape (T,), sized by the options of :func:`options`);
- a torchvision classification model (``resnet50``, ``vgg16``, ...), built without weights;
- ``timm:NAME``, a timm model (``timm:resnetv2_50``), built without weights;
- ``package.module:function``, importable from the current directory or PYTHONPATH, called as
  ``function(num_classes=K, input_shape=(C, H, W))`` and returning an ``nn.Module``.
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from parascale.errors import UsageError
from parascale.models.probe import has_batchnorm, probe, remember_name, shape_error, short_cause
from parascale.models.timm_models import build_timm, check_timm, is_timm
from parascale.models.tv import build_torchvision, torchvision_names
from parascale.models.user import build_user, resolve_user

if TYPE_CHECKING:
    from torch import nn

__all__ = ["names", "check", "build", "probe", "has_batchnorm"]

#: parascale's own models: name -> "module:factory" under parascale.models, imported when the
#: model is built (the modules import torch; names and checks do not). A factory is called as
#: ``factory(num_classes, input_shape, **sizes)``.
_REGISTRY: dict[str, str] = {
    "mlp": "small:MLP",
    "smallcnn": "small:SmallCNN",
    "lenet": "small:LeNet",
    "resnet20": "resnet_cifar:resnet20",
    "resnet32": "resnet_cifar:resnet32",
    "resnet56": "resnet_cifar:resnet56",
    "gpt": "gpt:build",
}

# models sized by configuration fields of their own: name -> "module:attribute" naming them
_OPTIONS: dict[str, str] = {"gpt": "gpt:OPTIONS"}
_TOKEN_MODELS = ("gpt",)  # input (B, T) token ids; every other built-in model takes images


def _load(spec: str):
    """The object ``module:attribute`` names under parascale.models."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)


# What an --image-size hint proposes when a model cannot even be built for a shape:
# parascale's models are sized for small images, torchvision's for ImageNet.
_OWN_SIZE_HINT = 32
_TORCHVISION_SIZE_HINT = 224


def names() -> list[str]:
    """parascale's own registered model names."""
    return list(_REGISTRY)


def options(cfg) -> dict:
    """The keyword arguments ``build`` passes to the model's factory (its sizes), or none."""
    fields = _load(_OPTIONS[cfg.job.model]) if cfg.job.model in _OPTIONS else ()
    return {name: cfg.value(name) for name in fields}


def _closest(name: str) -> str | None:
    """The known name most like ``name``; ties go to parascale's names, then alphabetical order.

    difflib alone breaks ties by the larger string, which would offer resnet32 for "resnet2".
    """
    low = name.lower()
    candidates = names() + [n for n in torchvision_names() if n not in _REGISTRY]
    close = difflib.get_close_matches(low, candidates, n=len(candidates), cutoff=0.6)

    def rank(candidate: str) -> tuple[float, bool, str]:
        ratio = difflib.SequenceMatcher(None, low, candidate).ratio()
        return (-ratio, candidate not in _REGISTRY, candidate)

    return min(close, key=rank) if close else None


def _unknown(name: str) -> UsageError:
    closest = _closest(name)
    hint = f" (did you mean {closest!r}?)" if closest else ""
    return UsageError(
        f"unknown model {name!r}{hint}; parascale's models are {', '.join(names())}; "
        "torchvision classification names (e.g. resnet50, vgg16), timm's as 'timm:NAME' "
        "(e.g. timm:resnetv2_50) and 'package.module:function' are accepted too"
    )


def check(name: str) -> None:
    """Raise UsageError unless ``name`` can be built; cheap, so it runs before workers start.

    A ``package.module:function`` is imported to check that the function exists and is callable.
    """
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"model name must be a non-empty string, got {name!r}")
    if name in _REGISTRY:
        return
    if is_timm(name):
        check_timm(name)
        return
    if ":" in name:
        resolve_user(name)
        return
    if name not in torchvision_names():
        raise _unknown(name)


def _checked_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
    shape = tuple(input_shape)
    if len(shape) not in (1, 3) or not all(isinstance(s, int) and not isinstance(s, bool)
                                           and s > 0 for s in shape):
        raise UsageError(f"input shape must be three positive integers (C, H, W), or one (T) "
                         f"for token sequences, got {shape!r}")
    return shape  # type: ignore[return-value]


def build(name: str, num_classes: int, input_shape: tuple[int, ...], **sizes) -> nn.Module:
    """Build model ``name`` on the CPU for ``num_classes`` outputs and inputs of ``input_shape``.

    Initialisation draws only from torch's global RNG, so it is reproducible after the caller's
    ``torch.manual_seed``. ``sizes``: the model's own options (:func:`options`). Raises
    UsageError for an unknown name, bad arguments or a model that cannot be built for the shape
    (a 1-D shape (T,) is a sequence of T token ids, which only token models take).
    """
    check(name)
    shape = _checked_shape(input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise UsageError(f"number of classes must be a positive integer, got {num_classes!r}")
    if ":" in name and not is_timm(name):
        model = build_user(name, num_classes, shape)
    elif (len(shape) == 1) != (name in _TOKEN_MODELS):
        wanted = "images" if len(shape) == 1 else "token sequences"
        fix = "--model gpt" if len(shape) == 1 else "a text dataset (--dataset shakespeare)"
        raise UsageError(f"model {name!r} does not take this dataset's inputs of shape {shape}: "
                         f"it takes {wanted}; use {fix}")
    else:
        own = name in _REGISTRY
        factory = _load(_REGISTRY[name]) if own else partial(build_timm, name) if is_timm(name) \
            else partial(build_torchvision, name)
        try:
            model = factory(num_classes, shape, **sizes)
        except (RuntimeError, ValueError, AssertionError) as exc:
            # Shape-dependent construction (dry forwards, ViT patches, MaxViT windows) fails
            # here for inputs the architecture cannot take.
            hint = _OWN_SIZE_HINT if own else _TORCHVISION_SIZE_HINT
            raise shape_error(name, shape, short_cause(exc), hint) from exc
    remember_name(model, name)
    return model
