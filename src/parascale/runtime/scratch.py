"""Scratch folders named after the process that owns them, and the removal of orphaned ones.

A launcher, a rank 0 with parameter servers, a run without ``--out`` and ``parascale comm``
each keep files in a folder of their own (``parascale-job-*``, ``parascale-ps-*``,
``parascale-run-*``, ``parascale-comm-*``, and ``parascale-data-*`` for data handed to workers,
in the temporary directory) and remove it when they
end. A process killed by SIGKILL cannot, so the folder's name carries its owner's pid and start
time (``parascale-job-<pid>.<start>-<random>``), and the next launch removes every such folder
whose owner is gone. The start time tells the owner from a later process that reuses its pid.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil

PREFIXES = ("parascale-job-", "parascale-ps-", "parascale-run-", "parascale-comm-",
            "parascale-data-")
_TAG = re.compile(r"(\d+)\.(\d+)-")


def _started(pid: int) -> int | None:
    """A process's start time in hundredths of a second (the kernel's clock), or None if gone."""
    try:
        return round(psutil.Process(pid).create_time() * 100)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def owner_tag(pid: int | None = None) -> str:
    """``<pid>.<start>`` of this process (or of ``pid``)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}.{_started(pid)}"


def make_dir(prefix: str, where: str | os.PathLike | None = None) -> Path:
    """A new private folder ``<prefix><pid>.<start>-<random>`` in ``where`` (default: the
    temporary directory), owned by this process."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-", dir=where))


def owner_alive(name: str, prefix: str) -> bool:
    """Whether the process named in folder ``name`` still runs; True for names we did not make."""
    match = _TAG.match(name[len(prefix):])
    if not name.startswith(prefix) or not match:
        return True
    started = _started(int(match.group(1)))
    return started is not None and abs(started - int(match.group(2))) <= 1


def sweep(where: str | os.PathLike | None = None,
          prefixes: tuple[str, ...] = PREFIXES) -> list[Path]:
    """Remove this user's folders in ``where`` (default: the temporary directory) whose owner is
    gone; return them. Folders of running parascale processes, and anything else, are kept."""
    folder = Path(where or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        prefix = next((p for p in prefixes if entry.name.startswith(p)), None)
        try:
            mine = entry.is_dir(follow_symlinks=False) and entry.stat().st_uid == os.getuid()
        except OSError:  # removed meanwhile
            continue
        if prefix is None or not mine or owner_alive(entry.name, prefix):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed
