"""The process world: launching local workers, joining torchrun/srun worlds, devices, failures.

The names below are loaded on first use, so that :mod:`.processes` (which starts the fork
server) can be imported before torch is; local launches live in :mod:`.local`.
"""
from __future__ import annotations

import importlib

_WHERE = {"Outcome": "local", "check_oversubscription": "local", "launch": "local",
          "open_store": "rendezvous", "World": "world", "external_launcher": "env",
          "external_size": "env", "join": "world", "joined": "world", "leave": "world",
          "resolve_backend": "world", "resolve_device_type": "world"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value

