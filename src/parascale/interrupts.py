"""SIGTERM handled like Ctrl-C, and moments that neither may interrupt.

Slurm sends SIGTERM on cancel and time-out, and so do most schedulers and ``kill``. By default
it ends Python at once: no worker stopped in order, no line said, scratch folders left behind.
Inside :func:`sigterm_interrupts` it raises :class:`Terminated`, a ``KeyboardInterrupt``, so
every path that cleans up after Ctrl-C (the launcher stopping its workers, a study staying
resumable) does the same for SIGTERM; the command line then exits with 143 (128 + 15).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_CODE = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived; handled wherever Ctrl-C is."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in the main thread while inside; a program that
    handles SIGTERM itself (or ignores it) keeps its own handling."""
    if not _main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done, then take effect as usual.

    For the few renames that replace a run's results: interrupted half-way, the folder would
    hold one run's model beside another's record.
    """
    if not _main_thread():
        yield
        return
    pending: list[int] = []
    saved = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not None and handler is not signal.SIG_IGN:  # None: set outside Python
            saved[signum] = signal.signal(signum, lambda number, frame: pending.append(number))
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
        if pending:
            signal.raise_signal(pending[0])
