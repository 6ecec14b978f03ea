"""A module imported on its first use, for modules that must load without it.

The strategies' registry (``parascale.sync``) is read by ``--help``, ``report`` and validation,
none of which should pay for importing torch; the strategies' files still use torch in every
method. Each binds a stand-in at the top::

    if TYPE_CHECKING:          # what mypy reads
        import torch.distributed as dist
    else:
        dist = lazy.module("torch.distributed", globals(), "dist")

The stand-in's first attribute lookup imports the module and puts the real one in its place in
the importing module's globals, so every later use is an ordinary global lookup: nothing is
added to a training step's path after the first.
"""
from __future__ import annotations

import importlib
from typing import Any


class _Deferred:
    """Stands for a module until an attribute of it is first asked for."""

    def __init__(self, name: str, namespace: dict[str, Any], bound_as: str):
        self._name, self._namespace, self._bound_as = name, namespace, bound_as

    def __getattr__(self, attribute: str) -> Any:
        real = importlib.import_module(self._name)
        if self._namespace.get(self._bound_as) is self:
            self._namespace[self._bound_as] = real
        return getattr(real, attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def module(name: str, namespace: dict[str, Any], bound_as: str | None = None) -> Any:
    """A stand-in for module ``name``, bound in ``namespace`` (the caller's ``globals()``) as
    ``bound_as`` (default: the last part of the name), which it replaces on first use."""
    bound = bound_as or name.rpartition(".")[2]
    return _Deferred(name, namespace, bound)
