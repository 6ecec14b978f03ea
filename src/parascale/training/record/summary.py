"""What a finished run hands to the record (``Summary``, training/record/assemble.py): its
epochs, the step rows that count as steady state, its times and the sections other parts
measured."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parascale.runrecord import EpochEntry
from parascale.training.observe.measure import epochs_named
from parascale.training.record.progress import Progress


@dataclass
class Steady:
    """This rank's step rows that count as steady state, what was left out, which steps."""

    rows: list[list[float]]
    excluded: str
    source: str


def steady(progress: Progress, steps_per_epoch: int, planned_epochs: int) -> Steady:
    """The step-time rows that count as steady state, what was left out, and where they are.

    Warm-up epochs are left out: the first, and the one each resume continued in (a new
    process warms up again)."""
    epochs = progress.epochs
    warm = [e.epoch for e in epochs if e.warmup]
    profiled = [e.epoch for e in epochs if e.profiled and not e.warmup]
    kept = [e for e in epochs if not e.warmup and not e.profiled]
    if kept:
        rows = [row for e in kept for row in progress.rows.get(e.epoch, [])]
        if profiled:
            return Steady(rows, f"{epochs_named(warm)} (warm-up) and {epochs_named(profiled)} "
                          "(profiled)", f"the steps of {epochs_named([e.epoch for e in kept])}")
        if warm == [1] and [e.epoch for e in kept] == list(range(2, epochs[-1].epoch + 1)):
            partial = "" if epochs[-1].steps == steps_per_epoch else \
                f" (the partial epoch {epochs[-1].epoch})"
            return Steady(rows, "epoch 1 (warm-up)",
                          f"steps {epochs[0].steps + 1}-{progress.step}{partial}")
        return Steady(rows, f"{epochs_named(warm)} (warm-up: the first, and each one a resumed "
                      "run continued in)", f"the steps of {epochs_named([e.epoch for e in kept])}")
    # no steady epoch: the last one's first tenth (at least a step) stands in for the warm-up
    last = epochs[-1].epoch
    warmup_rows = progress.rows.get(last, [])
    cut = min(max(1, len(warmup_rows) // 10), len(warmup_rows) - 1)
    if len(epochs) > 1 or progress.resumed:
        where = f"epoch {last} (each earlier epoch a warm-up)" if len(epochs) > 1 else \
            f"epoch {last} (the only one, after a resume)"
    else:
        where = "the only epoch" if planned_epochs == 1 else \
            "epoch 1 (training stopped at the target there)"
    return Steady(warmup_rows[cut:], f"first {cut} steps of {where}",
                  f"steps {cut + 1}-{len(warmup_rows)} of {where}")


@dataclass
class Times:
    setup_s: float  # start-up of this attempt, the strategy's decisions excluded
    total_s: float  # the run's training time, earlier attempts' up to the checkpoint included
    training_s: float  # this attempt's training time
    start: str  # when this attempt started (ISO time)
    first_step_at: float  # time.time() of the first step


@dataclass
class Summary:
    """What a finished run hands to the record (training/record/assemble.py)."""

    epochs: list[EpochEntry]
    steady: Steady
    tta: dict[str, Any] | None
    times: Times
    window: dict[str, Any]  # this rank's share of the contention measurement
    search: dict[str, Any] | None  # the trial's number and the epoch it was pruned after
    continuity: dict[str, Any]  # resumed, restarts, checkpoints, profile and noise sections
    task: dict[str, Any]  # the record's task section: unit, metrics, directions, judge
    flops: dict[str, Any] | None = None  # what flops.measure counted, None when nothing
