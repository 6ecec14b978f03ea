"""The process world: launching local workers, joining torchrun/srun worlds, devices, failures.

The names below are loaded on first use, so that :mod:`.processes` (which starts the fork
server) can be imported before torch is. ``launch`` is the function, although a submodule has
that name too (import it as ``from parascale.runtime.launch import ...``).
"""
from __future__ import annotations

import importlib
import sys
import types

_WHERE = {"Outcome": "launch", "check_oversubscription": "launch", "launch": "launch",
          "open_store": "launch", "World": "world", "external_launcher": "world",
          "external_size": "world", "join": "world", "joined": "world", "leave": "world",
          "resolve_backend": "world", "resolve_device_type": "world"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # importing the submodule .launch would otherwise replace the function of that name
        if not (name == "launch" and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
