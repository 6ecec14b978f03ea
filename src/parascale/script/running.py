"""Running the user's script in a worker: as ``python script.py args`` would, then the record.

What the launcher reports of a failing script is its own error and its own line ("rank 1
failed: ValueError: bad shape (train.py:41)"), not the line of parascale or torch it ended in;
its traceback stays in the record's ``detail``. A script that exits with a non-zero status
fails the job the same way; one that never called :func:`parascale.script.start` too, since
its copies trained alone and nothing measured them. A copy that exits with status 0 goes on to
the run's closing collective; if that breaks, it was this copy that left while the others still
trained, and the launcher names it (with its line) rather than the copies it left waiting.
"""
from __future__ import annotations

import contextlib
import os
import runpy
import sys
import sysconfig
import traceback
from pathlib import Path

from parascale.errors import KnownFailure
from parascale.runtime import contract
from parascale.runtime.failure import LEFT_EARLY, describe, is_out_of_memory, is_secondary
from parascale.training.observe.console import ConsoleLog

_LIBRARIES = tuple({str(Path(p).resolve()) for p in (
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"], Path(__file__).resolve().parent.parent)})


class ScriptFailed(KnownFailure):
    """The script raised or exited non-zero: the message names its error and line."""


class ScriptLeft(KnownFailure):
    """The script exited with status 0 where the other copies did not: it left their run."""

    left = True

    def __init__(self, message: str):
        super().__init__(message, secondary=True)


def where(exc: BaseException) -> str:
    """'file.py:41': the innermost frame of the user's own code (not a library's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARIES)
           and not f.filename.startswith("<")]
    frame = own[-1] if own else (frames[-1] if frames else None)
    return f"{Path(frame.filename).name}:{frame.lineno}" if frame else "?"


def run_script(path: str, argv: list[str]) -> None:
    """Run ``path`` as ``__main__`` with ``argv``; then finish its run (the record)."""
    from parascale import script

    sys.argv = [path, *argv]
    sys.path.insert(0, str(Path(path).resolve().parent))  # as python puts the script's folder
    name = Path(path).name
    log = _console()
    exited = None
    try:
        with log.tee() if log else contextlib.nullcontext():
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            said = f": {exc.code}" if isinstance(exc.code, str) else f" with status {exc.code}"
            raise ScriptFailed(f"{name} exited{said} ({where(exc)})") from exc
        exited = exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or is_secondary(exc) or is_out_of_memory(exc):
            raise  # the launcher's own words for these (a peer's failure, memory)
        traceback.print_exc()  # rank 0's on the terminal, the others' in their logs
        raise ScriptFailed(f"{describe(exc)} ({where(exc)})") from exc
    finally:
        if log:
            log.close()
    run = script.current()
    if run is None:
        raise ScriptFailed(f"{name} never called parascale.script.start(): its copies trained "
                           "alone and unmeasured (docs/scripts.md shows the lines to add)")
    try:
        run.finish()
    except BaseException as exc:
        if exited is not None and is_secondary(exc):
            raise ScriptLeft(f"{LEFT_EARLY} ({where(exited)})") from exc
        raise


def _console() -> ConsoleLog | None:
    """Rank 0's console log, where the launcher keeps the run's (contract.LOG)."""
    path = os.environ.get(contract.LOG)
    if path and os.environ.get(contract.RANK, "0") == "0":
        return ConsoleLog(path)
    return None


def main() -> None:
    """A worker of ``parascale run`` (``python -m parascale.script.worker``)."""
    import json

    from parascale.runtime.failure import serve_as_worker

    spec = json.loads(os.environ[contract.SCRIPT])
    serve_as_worker(lambda: run_script(spec["path"], spec["argv"]))
