"""A run's results reach its output folder only when the run has them, as one set.

The workers write into a staging folder beside ``--out`` (same filesystem, so a rename is
atomic): ``.<name>.parascale-<pid>.<start>-<random>``, or inside ``--out`` when only that folder
is writable. When the run ends with a result (ok, failed, out of memory), :meth:`Staging.commit`
writes the new record into the staging folder (so that every byte the set needs is on disk
before ``--out`` changes), then replaces the previous set in ``--out``: the old record is
removed first (so it never claims a model that is not its own), then each companion file is
moved in or, if this run made none, removed, then the new record is renamed in.
A run that cannot write its results (a full disk) has none: :func:`produce` keeps the previous
set and raises :class:`~parascale.errors.NoSpace`, one line.
A run that is refused or interrupted commits nothing: ``--out`` is left exactly as it was, and
folders this run created to hold it are removed again. A staging folder whose launcher was
killed (SIGKILL) is removed by the next run into the same ``--out``.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parascale.errors import NoSpace
from parascale.files import atomic_write_text, no_space_named
from parascale.runtime.scratch import make_dir, sweep
from parascale.interrupts import deferred


def _create_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; the ones made, deepest first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        made.mkdir(exist_ok=True)
    return missing


class Staging:
    """Where one run writes; ``with Staging(out) as staging:`` removes it whatever happens."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(os.path.abspath(out))
        self.prefix = f".{self.out.name}.parascale-"
        self.created = _create_folders(self.out.parent)
        where = self.out.parent
        if self.out.is_dir() and not os.access(where, os.W_OK | os.X_OK):
            where = self.out  # a writable --out in a read-only folder: stage inside it instead
        sweep(where, (self.prefix,))
        self.path = make_dir(self.prefix, where)
        self.committed = False

    def commit(self, record_name: str, text: str, companions: tuple[str, ...] = ()) -> None:
        """Replace the result set in ``out`` with this run's: ``companions`` (files the run may
        have written into the staging folder) and the record ``text``. Ctrl-C and SIGTERM wait
        until the set is complete."""
        atomic_write_text(self.path / record_name, text)  # a full disk stops it here
        with deferred():
            self.out.mkdir(exist_ok=True)
            (self.out / record_name).unlink(missing_ok=True)
            replace_set(self.path, self.out, companions)
            os.replace(self.path / record_name, self.out / record_name)
            self.committed = True

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if not self.committed:
            for folder in self.created:
                try:
                    folder.rmdir()
                except OSError:  # not empty: someone else put something there meanwhile
                    break

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def replace_set(source: Path, target: Path, names: tuple[str, ...]) -> None:
    """Move each of ``names`` (files, or folders such as traces/) from ``source`` into
    ``target``, replacing what is there; one that ``source`` lacks is removed from ``target``,
    since the files there are one run's set."""
    for name in names:
        there = target / name
        if there.is_dir() and not there.is_symlink():
            shutil.rmtree(there)
        if (source / name).exists():
            os.replace(source / name, there)
        else:
            there.unlink(missing_ok=True)


def produce(out: str | None, scratch_prefix: str, run: Callable[[Path], dict[str, Any]],
            record_name: str, text: Callable[[dict[str, Any]], str],
            companions: tuple[str, ...] = ()) -> dict[str, Any]:
    """``run(folder)`` writes a job's files into ``folder`` and returns its record. With ``out``
    the results replace the previous set there (:class:`Staging`); without it they are kept
    nowhere (a scratch folder, removed afterwards) and only the record is returned."""
    if not out:
        scratch = make_dir(scratch_prefix)
        try:
            return run(scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    try:
        with no_space_named(out), Staging(out) as staging:
            record = run(staging.path)
            staging.commit(record_name, text(record), companions)
            return record
    except NoSpace as exc:
        raise NoSpace(f"{exc}; {out} is left as it was") from exc
