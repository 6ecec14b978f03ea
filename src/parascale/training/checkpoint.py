"""Checkpoints on disk: save, verify, list, prune and load (the layout is docs/checkpoints.md).

One checkpoint is two files in ``DIR/checkpoints``::

    step-00000120.pt     torch.save of the run's state; read back with weights_only=True
    step-00000120.json   its manifest: step, epoch, size and SHA-256 of the .pt, the config

Each is written atomically (a temporary file in the same folder, fsync, rename), the .pt
first; the folder is fsynced after each rename. A checkpoint counts only when its manifest
exists, reads, and its .pt has the size and SHA-256 the manifest states: a kill between the
two renames leaves a .pt without manifest (ignored), and a truncated or corrupted file fails
the checksum, so :func:`newest` says so and takes the one before. Only rank 0 writes.

The .pt is torch's own format, loadable without parascale (``torch.load(p, weights_only=True)``):
tensors, numbers, strings, lists and dicts only. ``torch.distributed.checkpoint`` is not used:
its gain is sharded state written by every rank in parallel (FSDP, tensor parallelism), and
here every rank holds a whole model; it would also bring no checksum.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from parascale.files import atomic_write

FORMAT = "parascale.checkpoint/1"
FOLDER = "checkpoints"
LOG_NAME = "log.txt"  # the unfinished run's console log, beside its checkpoints
_NAME = re.compile(r"step-(\d{8,})\.pt")
CHUNK = 1 << 20


def name(step: int) -> str:
    return f"step-{step:08d}"


def folder_of(out: str | os.PathLike) -> Path:
    return Path(os.path.abspath(out)) / FOLDER


@dataclass
class Found:
    """One checkpoint in a folder: its .pt, its step, its manifest, and what is wrong with it
    (None when it verified)."""

    path: Path
    step: int
    manifest: dict[str, Any] | None = None
    problem: str | None = None

    @property
    def manifest_path(self) -> Path:
        return self.path.with_suffix(".json")

    @property
    def label(self) -> str:
        """``checkpoints/step-00000120.pt``: how records and messages name it."""
        return f"{self.path.parent.name}/{self.path.name}"


class _Hashing:
    """A file object for ``torch.save`` that hashes and counts what it writes."""

    def __init__(self, handle):
        self.handle, self.sha, self.size = handle, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.sha.update(view)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


def _fsync_folder(folder: Path) -> None:
    """Make the renames in ``folder`` durable (a crash after rename could otherwise lose it)."""
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic(path: Path, write: Callable[[Any], object]) -> None:
    """Written atomically (parascale.files), then the rename made durable."""
    atomic_write(path, write)
    _fsync_folder(path.parent)


def save(folder: Path, step: int, state: dict[str, Any], manifest: dict[str, Any]) -> Found:
    """Write ``state`` as checkpoint ``step`` in ``folder``, then its manifest (``manifest``
    plus format, step, size and checksum). Returns the checkpoint, verified by construction."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name(step)}.pt"
    hashed: list[_Hashing] = []

    def write_state(handle) -> None:
        writer = _Hashing(handle)
        torch.save(state, writer)
        hashed.append(writer)

    _atomic(path, write_state)
    facts = {"format": FORMAT, "step": step, **manifest,
             "bytes": hashed[0].size, "sha256": hashed[0].sha.hexdigest()}
    text = json.dumps(facts, indent=2) + "\n"
    _atomic(path.with_suffix(".json"), lambda handle: handle.write(text.encode()))
    return Found(path, step, facts)


def listing(folder: Path) -> list[Found]:
    """Every checkpoint file in ``folder``, oldest first, not yet verified."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = [Found(folder / n, int(m.group(1))) for n in names if (m := _NAME.fullmatch(n))]
    return sorted(found, key=lambda f: f.step)


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def verify(found: Found) -> Found:
    """``found`` with its manifest read and ``problem`` set when it cannot be used."""
    try:
        manifest = json.loads(found.manifest_path.read_text())
    except FileNotFoundError:
        found.problem = "it has no manifest (the write did not finish)"
        return found
    except (OSError, ValueError) as exc:
        found.problem = f"its manifest is unreadable ({exc})"
        return found
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found.problem = f"its manifest is not a {FORMAT} manifest"
        return found
    found.manifest = manifest
    try:
        size = found.path.stat().st_size
        if size != manifest.get("bytes"):
            found.problem = (f"it has {size:,} bytes where its manifest says "
                             f"{manifest.get('bytes'):,}" if isinstance(manifest.get("bytes"), int)
                             else "its manifest gives no size")
        elif _sha256(found.path) != manifest.get("sha256"):
            found.problem = "its SHA-256 checksum does not match its manifest (corrupted)"
    except OSError as exc:
        found.problem = f"it cannot be read ({exc.strerror or exc})"
    return found


def newest(folder: Path, say: Callable[[str], None] = print) -> tuple[Found | None, list[Found]]:
    """The newest checkpoint in ``folder`` that verifies, and the newer ones that did not (each
    one said in a line through ``say``, with the one tried next)."""
    damaged: list[Found] = []
    for found in reversed(listing(folder)):
        verify(found)
        if found.problem is None:
            return found, damaged
        damaged.append(found)
        say(f"parascale: checkpoint {found.label} cannot be used: {found.problem}; "
            "trying the one before")
    return None, damaged


def prune(folder: Path, keep: int, current: int) -> list[Path]:
    """After checkpoint ``current`` is written: remove every checkpoint past it (left by an
    attempt that went further before it failed: this run is writing its own again) and all
    but the newest ``keep``, manifests first, and temporaries a killed write left."""
    removed = []
    present = listing(folder)
    past = [f for f in present if f.step > current]
    mine = [f for f in present if f.step <= current]
    for found in past + mine[:max(0, len(mine) - keep)]:
        for path in (found.manifest_path, found.path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    for leftover in folder.glob(".step-*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    return removed


def load(found: Found | Path) -> dict[str, Any]:
    """The state saved in a checkpoint, on the CPU, read with ``weights_only=True`` (nothing
    but tensors and plain values can come out of the file) and memory-mapped, so that a rank
    pages in only the parts it uses."""
    path = found.path if isinstance(found, Found) else Path(found)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
