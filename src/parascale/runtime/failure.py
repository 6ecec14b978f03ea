"""What a failing worker tells the launcher: one JSON line in its error file, then exit.

A worker whose peer died sees a broken or timed-out collective. Such an error is marked
*secondary* so that the launcher names the rank that caused the failure, not its victims.
A worker whose own code ended it with status 0 (``sys.exit(0)``) before its work was done
*left*: its peers' collectives break, and the launcher names it as it names a worker that
exited with status 0 without a word (``os._exit(0)``).
A known failure (:class:`parascale.errors.KnownFailure`: divergence, a bad data file) is one
line for the user; every failure's traceback goes into the error file as ``detail``, which the
run record keeps, and an unexpected error's is printed too (rank 0's on the terminal, the
others' in their logs).
"""
from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from parascale import lazy, safejson
from parascale.errors import KnownFailure, NoSpace, UsageError, where
from parascale.files import full_disk
from parascale.runtime import contract
from parascale.runtime.processes import exit_now

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
else:  # the launcher's checks run without torch; a failure asks it only once torch is in use
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals())

DETAIL_LIMIT = 20_000  # characters of traceback kept for the record
_COLLECTIVE_WORDS = ("gloo", "nccl", "connection closed", "connection reset", "timed out",
                     "timeout", "broken pipe", "socket", "store")


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError))


def is_secondary(exc: BaseException) -> bool:
    """A failure of communication with other ranks, rather than of this rank's own work."""
    if isinstance(exc, dist.DistError) or getattr(exc, "secondary", False):
        return True
    if isinstance(exc, KnownFailure):
        return False
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(word in text for word in _COLLECTIVE_WORDS)


def left_early(exc: BaseException) -> bool:
    """The worker's own code ended it with status 0 (``sys.exit(0)``, or a failure marked
    ``left``) before its work was done."""
    return (isinstance(exc, SystemExit) and exc.code in (None, 0)) or getattr(exc, "left", False)


#: how the launcher says that a rank left: "rank 1 exited with status 0 before ..."
LEFT_EARLY = "exited with status 0 before the run finished"


def describe(exc: BaseException) -> str:
    """One line: the exception type and the first line of its message (a known failure's
    message alone: it says what happened)."""
    if isinstance(exc, SystemExit) and left_early(exc):
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames \
            else ""
        return f"{LEFT_EARLY} (sys.exit(0){where})"
    first = (str(exc).strip().splitlines() or [""])[0][:400]
    if isinstance(exc, KnownFailure) and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def detail(exc: BaseException) -> str:
    """The traceback, causes included, cut to its last ``DETAIL_LIMIT`` characters."""
    return "".join(traceback.format_exception(exc))[-DETAIL_LIMIT:]


def repeats(exc: BaseException) -> bool:
    """A failure that starting again from the same state would meet again (a diverging loss,
    an unreadable file, input refused): a restart from a checkpoint cannot help."""
    return isinstance(exc, (KnownFailure, UsageError)) and not getattr(exc, "secondary", False)


def write_error_file(exc: BaseException) -> None:
    """Leave the cause where the local launcher looks for it (no-op under torchrun or srun)."""
    path = os.environ.get(contract.ERROR_FILE)
    if not path:
        return
    # one that left is not the root cause where another rank failed on its own
    report = {"message": describe(exc), "secondary": is_secondary(exc) or left_early(exc),
              "left": left_early(exc),
              "oom": is_out_of_memory(exc), "repeats": repeats(exc), "detail": detail(exc),
              "no_space": isinstance(exc, NoSpace) or full_disk(exc) is not None}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(safejson.dumps(report))
    os.replace(tmp, path)


def exited(exc: SystemExit) -> KnownFailure:
    """``sys.exit()`` in the user's code (a task, a model) inside a worker, as a known failure:
    one line saying where, without a traceback on the terminal (the record keeps it)."""
    code = "" if exc.code is None else repr(exc.code)
    failure = KnownFailure(f"the user's code called sys.exit({code}){where(exc)}; code that "
                           "parascale runs in its workers must return or raise, never exit")
    failure.__cause__ = exc
    return failure


def serve_as_worker(body: Callable[[], object]) -> NoReturn:
    """Run one locally launched worker's body, tell the launcher about a failure, and exit."""
    try:
        body()
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        if isinstance(exc, SystemExit):  # parascale never exits a worker so: the user's code
            exc = exited(exc)
        write_error_file(exc)
        if not isinstance(exc, (KnownFailure, KeyboardInterrupt)) and not is_secondary(exc) \
                and not left_early(exc):
            traceback.print_exc()  # rank 0's goes to the terminal, others' to their log
        exit_now(1)
    exit_now(0)
