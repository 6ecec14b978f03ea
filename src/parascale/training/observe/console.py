"""Rank 0's console, kept: everything the run says on the terminal also goes to ``DIR/log.txt``.

The launcher and rank 0 are separate processes that share the terminal; each tees its own
``sys.stdout`` and ``sys.stderr`` into the same file, opened for appending, and writes it a
whole line at a time (one ``write`` on an ``O_APPEND`` descriptor), so their lines interleave
but never mix. Progress bars do not reach the file: the training loop draws them on the
terminal stream itself (:func:`terminal`), and a line the tee sees with carriage returns keeps
only what follows the last one (what a redrawn line finally shows), without terminal escapes.
A restarted attempt appends to the same file; see docs/checkpoints.md for where it lives.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class ConsoleLog:
    """A log file that takes whole lines, from any process, in the order they are written."""

    def __init__(self, path: str | os.PathLike, fresh: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0)
        self.fd = os.open(self.path, flags, 0o644)

    def line(self, text: str) -> None:
        """Append ``text`` as one or more lines (progress-bar redraws reduced, see the module)."""
        kept = [_clean(part) for part in text.split("\n")]
        data = "".join(f"{part}\n" for part in kept if part.strip())
        if data:
            try:
                os.write(self.fd, data.encode("utf-8", "replace"))
            except OSError:  # a full disk must not end the run the log describes
                pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    @contextlib.contextmanager
    def tee(self) -> Iterator[None]:
        """While inside, what this process prints also goes to the log. An exception that
        leaves the block is described there (the traceback of an unexpected one) before it
        goes on: the log must say how the run ended."""
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(saved[0], self), _Tee(saved[1], self)
        try:
            yield
        except BaseException as exc:
            self.line(_ending(exc))
            raise
        finally:
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, _Tee):
                    stream.flush_partial()
            sys.stdout, sys.stderr = saved


def _clean(line: str) -> str:
    return _ESCAPES.sub("", line.rsplit("\r", 1)[-1]).rstrip()


def _ending(exc: BaseException) -> str:
    from parascale.errors import KnownFailure, UsageError
    from parascale.record import now
    from parascale.runtime.failure import describe, detail, is_secondary

    if isinstance(exc, KeyboardInterrupt):
        return f"parascale: interrupted ({type(exc).__name__}) at {now()}"
    if is_secondary(exc):
        return f"parascale: stopped at {now()}, a peer having failed: {describe(exc)}"
    if isinstance(exc, (KnownFailure, UsageError)):
        return f"parascale: failed at {now()}: {describe(exc)}"
    return f"parascale: failed at {now()}:\n{detail(exc)}"


class _Tee:
    """A text stream that writes through to ``stream`` and sends whole lines to ``log``."""

    def __init__(self, stream: TextIO, log: ConsoleLog):
        self._stream, self._log, self._partial = stream, log, ""

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        self._partial += text
        if "\n" in self._partial:
            complete, self._partial = self._partial.rsplit("\n", 1)
            self._log.line(complete)
        return written

    def flush_partial(self) -> None:
        if self._partial:
            self._log.line(self._partial)
            self._partial = ""

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding... are the terminal's
        return getattr(self._stream, name)


def terminal(stream: TextIO) -> TextIO:
    """The terminal stream behind a tee (for progress bars, which the log leaves out)."""
    return stream._stream if isinstance(stream, _Tee) else stream


def worker_log(cfg, world) -> ConsoleLog | None:
    """Rank 0's log: the file the local launcher names (it writes there too), or DIR/log.txt
    under torchrun or srun, started afresh unless this run continues an earlier one."""
    from parascale.record import LOG_NAME, now
    from parascale.runtime import env

    if not world.is_main:
        return None
    if world.launcher == "local":
        path = os.environ.get(env.LOG_ENV)
        return ConsoleLog(path) if path else None
    if not cfg.output.out:
        return None
    log = ConsoleLog(os.path.join(cfg.output.out, LOG_NAME),
                     fresh=not cfg.checkpoint.resume and env.attempt() == 0)
    log.line(f"--- parascale, {world.launcher} launch, attempt {env.attempt()}, {now()} ---")
    return log
