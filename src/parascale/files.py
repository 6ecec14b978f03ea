"""Atomic file output: a result file is either the previous complete version or the new one.

Run records, models and reports are read by people and by scripts while studies are still
running, and a job may be killed at any moment, so nothing is ever left half-written: write a
temporary file in the same folder (same filesystem, so the rename is atomic), flush and fsync
it, then ``os.replace`` it over the target.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from parascale.errors import UsageError


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(handle)`` to fill ``path`` so that readers see the old file or the new one,
    nothing between (``write`` may stream, as ``torch.save`` does, instead of holding bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        # never leave the temporary behind, whatever interrupted us
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, nothing between."""
    return atomic_write(path, lambda handle: handle.write(data))


def atomic_write_text(path: Path, text: str) -> Path:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def check_writable_folder(path: str | os.PathLike, option: str = "--out") -> None:
    """UsageError unless ``path`` is, or can be made, a folder we may write into: it is a folder,
    or its nearest existing ancestor is a writable folder. Leaves nothing behind."""
    where = Path(os.path.abspath(path))
    if where.exists() and not where.is_dir():
        raise UsageError(f"{option} {path} exists and is not a folder")
    ancestor = where
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{option} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        what = "it is" if ancestor == where else f"its nearest existing folder {ancestor} is"
        raise UsageError(f"{option} {path}: {what} not writable; choose a folder you can "
                         "write to")
    # os.access answers yes to root everywhere, also where the file system refuses (/proc, a
    # root-squashed share): make a folder there and remove it at once
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".parascale-probe-", dir=ancestor))
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot create a folder in {ancestor} "
                         f"({exc.strerror or exc}); choose a folder you can write to") from None
