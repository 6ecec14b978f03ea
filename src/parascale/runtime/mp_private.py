"""The private parts of CPython's ``multiprocessing`` that :mod:`.processes` uses, in one place.

Forking workers from a warm fork server (docs/design.md, "Start-up: the fork server") needs
names that are not public API (:data:`NEEDED`): the process's ``_config`` (where the fork
server's socket folder goes), ``util._run_finalizers`` (multiprocessing's clean-up, which
``os._exit`` skips), and the fork server's and resource tracker's handles (``_forkserver_pid``,
``_forkserver_alive_fd``, ``_forkserver_address``, ``resource_tracker._fd`` and ``_pid``). They
exist in the CPython this project tests (3.11; README, "Tests"), but any release may rename
one. :func:`usable` says
whether all are there; where one is missing, :mod:`.processes` starts each process as a fresh
interpreter instead (slower to start, the same behaviour), and nothing here raises.

This module imports nothing but the standard library, so the launcher can use it before torch.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any

#: (module, object in it or "" for the module itself, attribute) that :mod:`.processes` reads
NEEDED = [
    ("multiprocessing.util", "", "_run_finalizers"),
    ("multiprocessing.process", "_current_process", "_config"),
    ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
    ("multiprocessing.forkserver", "_forkserver", "_forkserver_alive_fd"),
    ("multiprocessing.forkserver", "_forkserver", "_forkserver_address"),
    ("multiprocessing.forkserver", "", "main"),
    ("multiprocessing.connection", "", "arbitrary_address"),
    ("multiprocessing.resource_tracker", "_resource_tracker", "_fd"),
    ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
]


def _owner(module: str, name: str) -> Any:
    try:
        found = importlib.import_module(module)
    except ImportError:
        return None
    return getattr(found, name, None) if name else found


def missing() -> list[str]:
    """The names of :data:`NEEDED` that this Python lacks, dotted; empty where all are there."""
    return [".".join(p for p in (module, name, attr) if p) for module, name, attr in NEEDED
            if not hasattr(_owner(module, name), attr)]


def usable() -> bool:
    """Whether workers may fork from the fork server (every private part is there)."""
    return not missing()


def _get(module: str, name: str, attr: str) -> Any:
    return getattr(_owner(module, name), attr, None)


def process_config() -> dict | None:
    """multiprocessing's settings of this process (``tempdir`` among them), or None."""
    config = _get("multiprocessing.process", "_current_process", "_config")
    return config if isinstance(config, dict) else None


def run_finalizers() -> None:
    """Run multiprocessing's clean-up now (a process about to ``os._exit``); once loaded only."""
    run = getattr(sys.modules.get("multiprocessing.util"), "_run_finalizers", None)
    if run is not None:
        run()


def forkserver_pid() -> int | None:
    """The running fork server's process id, or None."""
    return _get("multiprocessing.forkserver", "_forkserver", "_forkserver_pid")


def socket_address() -> str:
    """A new path for a fork server's Unix socket, in multiprocessing's temporary folder."""
    return _get("multiprocessing.connection", "", "arbitrary_address")("AF_UNIX")


def serve_forks(listener_fd: int, alive_r: int) -> None:
    """Run multiprocessing's fork server loop in this process, on the listening socket
    ``listener_fd``, until every holder of the other end of the pipe ``alive_r`` has closed it
    (it then raises SystemExit)."""
    _get("multiprocessing.forkserver", "", "main")(listener_fd, alive_r, [])


def adopt_forkserver(address: str, alive_fd: int, pid: int) -> None:
    """Make ``pid``, a child of this process serving at ``address``, this process's fork server,
    as if multiprocessing had started it: ``alive_fd`` is the pipe end whose closing ends it."""
    server = _owner("multiprocessing.forkserver", "_forkserver")
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_fd
    server._forkserver_pid = pid


def stop_forkserver() -> None:
    """Stop the fork server (the next start begins a new one); nothing where none runs."""
    stop = _get("multiprocessing.forkserver", "_forkserver", "_stop")
    if stop is not None:
        stop()


def drop_forkserver_alive_fd() -> None:
    """In a fork server's child: close its copy of the pipe whose closing tells the server that
    its launcher is gone (only the launcher may hold it)."""
    server = _owner("multiprocessing.forkserver", "_forkserver")
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        server._forkserver_alive_fd = None


def tracker() -> tuple[int | None, int | None]:
    """The resource tracker's pipe and process id, if this process started or inherited one."""
    found = _owner("multiprocessing.resource_tracker", "_resource_tracker")
    return getattr(found, "_fd", None), getattr(found, "_pid", None)


def forget_tracker() -> None:
    """In a fork server's child: close the inherited tracker pipe, so that the child starts its
    own tracker on first need, as a fresh interpreter does."""
    found = _owner("multiprocessing.resource_tracker", "_resource_tracker")
    fd = getattr(found, "_fd", None)
    if fd is not None:
        os.close(fd)
        found._fd = found._pid = None
