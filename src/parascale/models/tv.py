"""torchvision classification models by name, always built without pretrained weights."""
from __future__ import annotations

import importlib.util
import inspect
import re
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["torchvision_names", "build_torchvision"]

#: a model's registration in torchvision's source: ``@register_model()`` (or with its name),
#: then, after any other decorators, the builder whose name it takes by default
_REGISTERED = re.compile(r"^@register_model\((?:name=)?(?:[\"']([\w.]+)[\"'])?\)\n"
                         r"(?:@.*\n|[ \t)].*\n)*?def (\w+)\(", re.MULTILINE)


@lru_cache(maxsize=1)
def torchvision_names() -> tuple[str, ...]:
    """The classification models torchvision registers (no detection/segmentation/video),
    sorted, as ``torchvision.models.list_models(module=torchvision.models)`` gives them."""
    return registered_in_source() or _imported_names()


def registered_in_source() -> tuple[str, ...]:
    """The names read from torchvision's source files without importing it (torchvision
    imports torch: seconds, which an unknown name's one-line error should not cost). The
    classification models are the ones registered in ``torchvision/models/*.py`` itself,
    not in its subpackages. Empty where torchvision or its source is not found."""
    try:
        spec = importlib.util.find_spec("torchvision")  # found, not imported
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    names = set()
    try:
        for source in folder.glob("*.py"):
            for match in _REGISTERED.finditer(source.read_text(encoding="utf-8")):
                names.add(match.group(1) or match.group(2))
    except (OSError, UnicodeDecodeError):
        return ()
    return tuple(sorted(names))


def _imported_names() -> tuple[str, ...]:
    import torchvision.models as tvm

    return tuple(tvm.list_models(module=tvm))


def _constructor_kwargs(name: str, input_shape: tuple[int, int, int]) -> dict[str, Any]:
    """Extra keyword arguments for the model class behind ``name``, where it accepts them.

    The builders pass ``**kwargs`` on to the model class their return annotation names, so the
    class's signature tells which options exist without hard-coding model names.
    """
    import torchvision.models as tvm
    from torch import nn

    cls = inspect.signature(tvm.get_model_builder(name)).return_annotation
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        return {}
    params = inspect.signature(cls.__init__).parameters
    _, h, w = input_shape
    kwargs: dict[str, Any] = {}
    if "aux_logits" in params:
        # With auxiliary heads, inception_v3 and googlenet return a namedtuple in train mode,
        # which the loss cannot take; the heads only matter for the original training recipe.
        kwargs["aux_logits"] = False
    if "init_weights" in params:
        # Their default (None) warns that the init will change; True is today's init, silently.
        kwargs["init_weights"] = True
    if "image_size" in params and h == w:
        kwargs["image_size"] = h  # ViTs size their position embedding for one square size
    if "input_size" in params:
        kwargs["input_size"] = (h, w)  # MaxViT plans its attention windows for one size
    return kwargs


def build_torchvision(
    name: str, num_classes: int, input_shape: tuple[int, int, int]
) -> nn.Module:
    """torchvision model ``name``, random weights (never downloaded), ``num_classes`` outputs.

    Inputs with C != 3 channels go through a learned 1x1 convolution to 3 channels first.
    """
    import torchvision.models as tvm
    from torch import nn

    net = tvm.get_model(
        name, weights=None, num_classes=num_classes, **_constructor_kwargs(name, input_shape)
    )
    channels = input_shape[0]
    if channels == 3:
        return net
    # Every torchvision stem hard-codes 3 input channels under an architecture-specific name
    # (conv1, features[0][0], conv_proj, ...). A 1x1 adapter in front works for all of them
    # and leaves the architecture itself exactly as published.
    return nn.Sequential(OrderedDict(adapter=nn.Conv2d(channels, 3, kernel_size=1), net=net))
