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
"""
from __future__ import annotations

import math
from typing import Any

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


class TensorBoardWriter:
    """One run's event files in ``folder``; its x axis is the epoch."""

    def __init__(self, folder: str):
        from torch.utils.tensorboard import SummaryWriter  # here: see the module docstring

        self.writer = SummaryWriter(log_dir=folder)

    def epoch(self, entry: dict[str, Any]) -> None:
        """Write the series of the finished epoch ``entry`` (a record's epoch entry), flushed
        at once: a dashboard watching a long run sees each epoch as it ends."""
        for tag, value in scalars(entry).items():
            self.writer.add_scalar(tag, value, global_step=int(entry["epoch"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_tensorboard(folder: str | None, is_main: bool) -> TensorBoardWriter | None:
    """The run's writer: on rank 0 of a run given ``--tensorboard folder``, else None."""
    return TensorBoardWriter(folder) if folder and is_main else None
