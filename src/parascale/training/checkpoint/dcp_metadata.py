"""The one pickle of a sharded checkpoint, DCP's ``.metadata``, read without running code.

DCP pickles its metadata and reads it back with ``pickle.load``; here an unpickler builds
nothing but DCP's own metadata classes and the few plain types they hold, so that a forged
checkpoint cannot run code (the checksums catch damage, not forgery). Kept apart from
training/checkpoint/sharded.py, which writes and loads the state, so that checkpoint.py can check a
found checkpoint's metadata without importing what imports it.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import (Metadata, MetadataIndex, StorageMeta,
                                                   TensorStorageMetadata)

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
        return f"its {METADATA} is not torch.distributed.checkpoint's ({_first_line(exc)})"
    return None


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def shards_problem(folder: Path) -> str | None:
    """What is wrong with a sharded checkpoint's parts (None: nothing), for
    ``checkpoint.inspect``: each part read as DCP's reader reads it (``torch.load`` of its bytes,
    weights only) and held to the shape and dtype the metadata gives it. A checksum vouches that
    a file is what was written, not that DCP can read it (a bug, a hand edit, a forged
    manifest), and a part that cannot be read would stop the resume inside ``dcp.load``, on
    every rank, instead of letting it take the checkpoint before. One part in memory at a
    time."""
    try:
        metadata = _read_metadata(folder)
    except Exception as exc:  # noqa: BLE001 - metadata_problem names it
        return f"its {METADATA} is not torch.distributed.checkpoint's ({_first_line(exc)})"
    parts: dict[str, list[tuple[MetadataIndex, Any]]] = defaultdict(list)
    for index, where in (metadata.storage_data or {}).items():
        parts[where.relative_path].append((index, where))
    for name, items in sorted(parts.items()):
        try:
            with open(folder / name, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                for index, where in sorted(items, key=lambda item: item[1].offset):
                    problem = _part_problem(metadata, index, where, handle, size)
                    if problem:
                        return f"its {name} ({index.fqn}): {problem}"
        except OSError as exc:
            return f"its {name} cannot be read ({exc.strerror or exc})"
    return None


def _part_problem(metadata: Metadata, index: MetadataIndex, where: Any, handle: io.BufferedReader,
                  size: int) -> str | None:
    """What is wrong with one tensor's part at ``where`` in the open file ``handle``."""
    described = metadata.state_dict_metadata.get(index.fqn)
    if not isinstance(described, TensorStorageMetadata):
        return "its metadata does not describe it as a tensor"  # parascale saves tensors only
    if where.offset < 0 or where.length < 0 or where.offset + where.length > size:
        return f"it lies at bytes {where.offset:,} to {where.offset + where.length:,} of " \
            f"{size:,}"
    handle.seek(where.offset)
    try:
        with warnings.catch_warnings():  # bytes that are no torch file: their problem says it
            warnings.simplefilter("ignore")
            loaded = torch.load(io.BytesIO(handle.read(where.length)), map_location="cpu",
                                weights_only=True)
    except Exception as exc:  # noqa: BLE001 - pickle's, torch's: not a tensor torch wrote
        return f"torch cannot load it ({_first_line(exc)})"
    if not isinstance(loaded, torch.Tensor):
        return f"it holds a {type(loaded).__name__}, not a tensor"
    chunk = next((c for c in described.chunks if c.offsets == index.offset), None)
    expected = list(chunk.sizes) if chunk is not None else None
    if list(loaded.shape) != expected:
        return f"it holds a tensor of shape {list(loaded.shape)} where its metadata says " \
            f"{expected}"
    if loaded.dtype != described.properties.dtype:
        return f"it holds {loaded.dtype} where its metadata says {described.properties.dtype}"
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
