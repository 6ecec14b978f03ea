"""``--tensorboard DIR``: a run's figures as TensorBoard event files, so that people keep the
dashboards they already have.

Written through torch's own ``SummaryWriter`` (the tfevents format, file naming and flushing
are torch's and TensorBoard's business, not ours), by rank 0 alone, once per epoch: one scalar
series per figure of the record's epoch entry and one per part of the step (data, compute,
exposed sync, optimizer, the whole step). The values are the record's own (docs/record.md), so
a dashboard and ``parascale report`` never disagree. ``parascale train`` and the script API
both call :func:`open_tensorboard` and :meth:`TensorBoardWriter.epoch`.

``torch.utils.tensorboard`` is imported only when a run asks for it: it pulls in the whole
``tensorboard`` package, seconds of start-up on a busy machine that most runs do not need.

The series are a copy of the record's figures, so a file that cannot be written (a full disk)
costs the series, not the run: it is said once, in one line naming the file and the option,
and the run goes on without them.
"""
from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parascale.files import full_disk
from parascale.runrecord import STEP_SPLIT

#: epoch-entry keys that number or label the epoch rather than measure it
_NOT_FIGURES = frozenset({"epoch", "steps", "samples", "noise_steps", "warmup", "partial",
                          "resumed", "profiled"})
#: record keys whose first word is the split they were measured on: TensorBoard groups a
#: series by the part of its tag before the first '/', so test and val sit side by side
_SPLITS = ("train_", "test_", "val_")


def tag_of(key: str) -> str:
    """The series name of the epoch entry's ``key``: test_accuracy -> test/accuracy,
    throughput -> run/throughput."""
    for split in _SPLITS:
        if key.startswith(split):
            return f"{split[:-1]}/{key[len(split):]}"
    return f"run/{key}"


def scalars(entry: dict[str, Any]) -> dict[str, float]:
    """Every series' value at one epoch: the entry's finite numbers and its step split
    (``step_time/<part>``, seconds); lists (per rank), flags and missing values are left out."""
    found: dict[str, float] = {}
    for key, value in entry.items():
        if key in _NOT_FIGURES or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            found[tag_of(key)] = float(value)
    for part, seconds in (entry.get(STEP_SPLIT) or {}).items():
        if isinstance(seconds, (int, float)) and math.isfinite(seconds):
            found[f"step_time/{part}"] = float(seconds)
    return found


#: the module of TensorBoard's writer thread, which re-raises a failed write where threading
#: prints it as a traceback; the writer's next call raises it again in the run's thread
_WRITER_THREAD = "tensorboard.summary.writer.event_file_writer"


def _from_writer_thread(args: Any) -> bool:
    """Whether a thread's uncaught exception (``threading.excepthook``'s ``args``) is an
    OSError of TensorBoard's writer thread."""
    if not isinstance(args.exc_value, OSError):
        return False
    frame = args.exc_traceback
    while frame is not None:
        if frame.tb_frame.f_globals.get("__name__") == _WRITER_THREAD:
            return True
        frame = frame.tb_next
    return False


def _quiet_writer_thread() -> None:
    """Leave a failed write of TensorBoard's writer thread to :class:`TensorBoardWriter`, which
    says it in one line; every other thread's exception is shown as before."""
    shown = threading.excepthook
    if getattr(shown, "parascale_quiet", False):
        return

    def hook(args: Any) -> None:
        if not _from_writer_thread(args):
            shown(args)

    hook.parascale_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class TensorBoardWriter:
    """One run's event files in ``folder``; its x axis is the epoch. A write that fails stops
    the series (said once on stderr), never the run."""

    def __init__(self, folder: str):
        from torch.utils.tensorboard import SummaryWriter  # here: see the module docstring

        self.folder = folder
        self.writer: Any = None
        _quiet_writer_thread()
        self.writer = self._attempt(lambda: SummaryWriter(log_dir=folder))

    def _attempt(self, action: Callable[[], Any]) -> Any:
        """``action()``, or None once a write has failed: the failure said, the series
        stopped."""
        try:
            return action()
        except OSError as exc:
            self._give_up(exc)
            return None

    def _give_up(self, exc: OSError) -> None:
        full = full_disk(exc) or exc
        reason = (full.strerror or str(full)).lower()
        print(f"parascale: warning: --tensorboard {self.folder}: cannot write {self._file()} "
              f"({reason}); the run goes on without its TensorBoard series; the record keeps "
              "every figure", file=sys.stderr, flush=True)
        writer, self.writer = self.writer, None
        if writer is not None:
            try:  # its thread has stopped; what it held is lost with the file's room
                writer.close()
            except OSError:
                pass

    def _file(self) -> str:
        """This process's event file (TensorBoard names it after the host and the pid), or the
        folder when none was made."""
        try:
            mine = sorted(p for p in Path(self.folder).iterdir()
                          if p.name.startswith("events.out.tfevents.")
                          and f".{os.getpid()}." in p.name)
        except OSError:
            mine = []
        return str(mine[-1]) if mine else self.folder

    def epoch(self, entry: dict[str, Any]) -> None:
        """Write the series of the finished epoch ``entry`` (a record's epoch entry), flushed
        at once: a dashboard watching a long run sees each epoch as it ends."""
        writer = self.writer
        if writer is None:
            return

        def write() -> None:
            for tag, value in scalars(entry).items():
                writer.add_scalar(tag, value, global_step=int(entry["epoch"]))
            writer.flush()

        self._attempt(write)

    def close(self) -> None:
        if self.writer is not None:
            self._attempt(self.writer.close)


def open_tensorboard(folder: str | None, is_main: bool) -> TensorBoardWriter | None:
    """The run's writer: on rank 0 of a run given ``--tensorboard folder``, else None."""
    return TensorBoardWriter(folder) if folder and is_main else None
