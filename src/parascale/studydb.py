"""The search's database URL: checked before use, shown without its password, and locked while
a study's database is opened in a SQLite file.

Optuna creates its tables, its version row and its Alembic stamp one after the other, each
"if absent", whenever a storage is opened, so two openers of a new database (two searches, a
search and its trials, a search and a reader) both find them absent and one fails ("table
studies already exists", "UNIQUE constraint failed: alembic_version.version_num"). Every
opener in parascale goes through :func:`open_storage`: for a SQLite file it takes an exclusive
lock on the file's folder first (a lock on the folder itself, so nothing is left beside the
database); a race lost to anything else (a database server, another program) is retried.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from parascale.errors import UsageError

# user:password@ after the scheme; up to the last '@', because a password typed with an
# unescaped '@' was meant whole (SQLAlchemy would stop at the first and take the rest for the
# host, which would then show the password's tail)
_PASSWORD = re.compile(r"^([A-Za-z][\w+.-]*://[^:/@]*):.*@")
T = TypeVar("T")
SHOWN = 80  # characters of a user's text echoed in an error


def clip(text: str, limit: int = SHOWN) -> str:
    """At most ``limit`` characters of ``text``, then how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``, the rest as the user spelled it."""
    return _PASSWORD.sub(r"\1:***@", url)


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's error, say) with ``url``'s password nowhere in it."""
    text = text.replace(url, masked(url))
    found = _PASSWORD.match(url)
    if found:
        secret = url[found.end(1) + 1:found.end() - 1]
        if secret:
            from urllib.parse import unquote

            for form in {secret, unquote(secret)}:
                text = text.replace(form, "***")
    return text


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (absolute), None for other databases; a database in memory is
    refused: the trials run in processes of their own and could not reach it."""
    if not url.lower().startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # Optuna says what is wrong with it
    name = parsed.database or ""
    if name in ("", ":memory:") or parsed.query.get("mode") == "memory":
        raise UsageError(f"--storage {clip(masked(url))} is a database in one process's memory, "
                         "which the trials (processes of their own) cannot share: give a file, "
                         "e.g. sqlite:///hpo.db, or leave --storage out")
    return Path(os.path.abspath(name.removeprefix("file:")))


def normal(url: str) -> str:
    """``url`` with a SQLite file's path made absolute (trials and later commands find the same
    file wherever they start); a database in memory refused."""
    path = _sqlite_file(url)
    if path is None:
        return url
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.database.startswith("file:"):
        return url  # a SQLite URI: the user's spelling is what the driver needs
    return parsed.set(database=str(path)).render_as_string(hide_password=False)


_held: set[Path] = set()  # folders this process has locked (a second flock would wait forever)


@contextlib.contextmanager
def locked(*folders: Path | None) -> Iterator[None]:
    """An exclusive lock on each existing folder, in one order (no deadlock between processes);
    a folder this process already holds is not locked again."""
    with contextlib.ExitStack() as stack:
        for folder in sorted({Path(f).resolve() for f in folders if f and Path(f).is_dir()}):
            if folder in _held:
                continue
            fd = os.open(folder, os.O_RDONLY)
            stack.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes
            _held.add(folder)
            stack.callback(_held.discard, folder)
        yield


def folder_of(url: str) -> Path | None:
    """The folder to lock while a study is created in ``url``: a SQLite file's."""
    path = _sqlite_file(url)
    return None if path is None else path.parent


def retried(make: Callable[[], T]) -> T:
    """``make()``, again when it lost a race to a concurrent creator (the second attempt finds
    what the other created and goes on)."""
    for attempt in range(3):
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - only the lost race is retried
            if attempt == 2 or not lost_race(exc):
                raise
    raise AssertionError("unreachable")


def open_storage(url: str):
    """Optuna's database storage for ``url``, the one way parascale opens a study's database:
    the search, its trials, tests and readers alike. Opening creates what is absent, so a
    SQLite file is opened under its folder's lock (see the module's note); SQLite waits for a
    lock held by a concurrent trial instead of failing at once (its default is 5 s)."""
    import optuna

    engine = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
    with locked(folder_of(url)):
        return retried(lambda: optuna.storages.RDBStorage(url, engine_kwargs=engine))


def lost_race(exc: BaseException) -> bool:
    """Whether ``exc`` is a concurrent creator's table, row or stamp that appeared between
    Optuna's look and its write (a second attempt finds it and goes on)."""
    import sqlalchemy.exc

    text = str(exc).lower()
    return isinstance(exc, sqlalchemy.exc.IntegrityError) or (
        isinstance(exc, sqlalchemy.exc.SQLAlchemyError) and "already exists" in text)


def version_problem(exc: RuntimeError) -> bool:
    return "optuna version" in str(exc).lower() and "schema" in str(exc).lower()
