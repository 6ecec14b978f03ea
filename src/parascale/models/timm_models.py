"""``timm:NAME``: a model from timm (PyTorch Image Models), built without pretrained weights.

timm keeps the architectures torchvision lacks, among them the pre-activation ResNets
(``resnetv2_50``, ``resnetv2_152``) of the BSC study. It is imported only for these names: it
imports torchvision, about 3 s.
"""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from parascale.errors import UsageError

if TYPE_CHECKING:
    from torch import nn

PREFIX = "timm:"


def is_timm(name: str) -> bool:
    return name.startswith(PREFIX)


def check_timm(name: str) -> None:
    try:
        import timm
    except ImportError:
        raise UsageError(f"model {name!r} needs timm: pip install timm") from None
    model = name[len(PREFIX):]
    if not timm.is_model(model):
        close = difflib.get_close_matches(model, timm.list_models(), n=1)
        hint = f" (did you mean 'timm:{close[0]}'?)" if close else ""
        raise UsageError(f"timm has no model {model!r}{hint}; see timm.list_models()")


def build_timm(name: str, num_classes: int, input_shape: tuple[int, int, int]) -> nn.Module:
    import timm

    return timm.create_model(name[len(PREFIX):], pretrained=False, num_classes=num_classes,
                             in_chans=input_shape[0])
