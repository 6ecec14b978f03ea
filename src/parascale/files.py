"""Atomic file output: a result file is either the previous complete version or the new one.

Run records, models and reports are read by people and by scripts while studies are still
running, and a job may be killed at any moment, so nothing is ever left half-written: write a
temporary file in the same folder (same filesystem, so the rename is atomic), flush and fsync
it, then ``os.replace`` it over the target. A full disk (or quota) is :class:`NoSpace`, one line
naming the file and what is free there, whatever raised it (torch.save hides the OSError
behind its own RuntimeError, "enforce fail at inline_container.cc").
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from parascale.errors import NoSpace, UsageError

#: what the file system answers when it has no room for what is written
_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def full_disk(exc: BaseException | None) -> OSError | None:
    """The OSError of a full file system behind ``exc`` (itself, or what it was raised from or
    while handling), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _free(path: Path) -> str:
    folder = path
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    try:
        return f", {shutil.disk_usage(folder).free / 1e6:.1f} MB free there"
    except OSError:
        return ""


def no_space(target: str | os.PathLike, exc: BaseException,
             advice: str = "free some space or choose another folder") -> NoSpace:
    """The one line for ``exc`` (a full disk, :func:`full_disk`) met writing ``target``."""
    full = full_disk(exc)
    reason = _FULL.get(full.errno or 0, _FULL[errno.ENOSPC]) if full else _FULL[errno.ENOSPC]
    where = Path(os.path.abspath(target))
    return NoSpace(f"{reason}: cannot write {where}{_free(where)}; {advice}")


@contextlib.contextmanager
def no_space_named(target: str | os.PathLike) -> Iterator[None]:
    """A full disk met inside becomes :class:`NoSpace` naming ``target`` (the file or folder
    being written); any other error goes on as it was."""
    try:
        yield
    except NoSpace:
        raise
    except BaseException as exc:
        if full_disk(exc) is None:
            raise
        raise no_space(target, exc) from exc


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(handle)`` to fill ``path`` so that readers see the old file or the new one,
    nothing between (``write`` may stream, as ``torch.save`` does, instead of holding bytes)."""
    path = Path(path)
    with no_space_named(path):
        return _atomic_write(path, write)


def _atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> Path:
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
