"""The one pickle of a sharded checkpoint, DCP's ``.metadata``, read without running code.

DCP pickles its metadata and reads it back with ``pickle.load``; here an unpickler builds
nothing but DCP's own metadata classes and the few plain types they hold, so that a forged
checkpoint cannot run code (the checksums catch damage, not forgery). Kept apart from
training/checkpoint/sharded.py, which writes and loads the state, so that checkpoint.py can check a
found checkpoint's metadata without importing what imports it.
"""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

METADATA = ".metadata"  # DCP's name for it
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALSO_SAFE = {("torch", "Size"), ("torch.serialization", "_get_layout"),
              ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
              ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
              ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}


class _Unpickler(pickle.Unpickler):
    """Builds DCP's metadata classes and the few plain types they hold, nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if module == _METADATA_MODULE:
            found = getattr(sys.modules[module], name, None)
            if isinstance(found, type) and found.__module__ == module:
                return found
        elif (module, name) in _ALSO_SAFE or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def _read_metadata(folder: Path) -> Metadata:
    with open(folder / METADATA, "rb") as handle:
        metadata = _Unpickler(handle).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"it holds a {type(metadata).__name__}")
    for where in (metadata.storage_data or {}).values():  # every part inside the folder
        relative = getattr(where, "relative_path", None)
        if not isinstance(relative, str) or os.path.basename(relative) != relative or \
                relative in ("", ".", ".."):
            raise pickle.UnpicklingError(f"it names {relative!r} as a file of the checkpoint")
    return metadata


def metadata_problem(folder: Path) -> str | None:
    """What is wrong with a sharded checkpoint's DCP metadata (None: nothing), for
    ``checkpoint.inspect``: read as :class:`Reader` will read it."""
    try:
        _read_metadata(folder)
    except Exception as exc:  # noqa: BLE001 - pickle's many errors: not DCP's metadata
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"its {METADATA} is not torch.distributed.checkpoint's ({type(exc).__name__}: " \
            f"{first})"
    return None


class Reader(FileSystemReader):
    """DCP's reader, with its metadata read by :class:`_Unpickler` instead of ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = _read_metadata(Path(self.path))
        storage = getattr(metadata, "storage_meta", None)
        if storage is None:
            storage = metadata.storage_meta = StorageMeta()
        storage.load_id = self.load_id
        return metadata
