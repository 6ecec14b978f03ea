"""Where a run stands (``Progress``): the optimizer steps taken, the sampler's place, the
record's epoch entries so far and the step rows they measured.

``Progress`` is the one owner of the run's state: the loop (and the script API) advances it, a
checkpoint saves what its ``state_dict`` returns (and each rank's step rows), and a resume puts
it back through ``load_state_dict`` (training/loop/setup.py), the way torchtitan's checkpointer
treats its ``Stateful`` components.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from parascale.runrecord import SAMPLES, EpochEntry, Unit

Rows = list[list[float]]  # one step per row: data, compute, sync, optimizer, step (seconds)


@dataclass
class Progress:
    """Where the run stands: the optimizer steps taken, the sampler's place, what the record
    needs from the epochs done, and the step rows they measured."""

    step: int = 0
    #: the sampler's place: optimizer steps done, the epoch it is in, that epoch's steps done
    position: dict[str, int] = field(default_factory=lambda: {"step": 0, "epoch": 1, "done": 0})
    epochs: list[EpochEntry] = field(default_factory=list)  # the record's entries so far
    tta: dict[str, Any] | None = None  # time-to-accuracy so far
    rows: dict[int, Rows] = field(default_factory=dict)  # this rank's step rows per epoch
    warm: set[int] = field(default_factory=lambda: {1})  # warm-up epochs: 1, each resume's
    resumed: list[dict[str, Any]] = field(default_factory=list)  # every resume, oldest first
    #: the options the strategy decided before training (``Strategy.resolve``: SMA's tuned
    #: learners), kept in checkpoints so that a resumed run goes on with them
    decided: dict[str, Any] = field(default_factory=dict)
    t_start: float = 0.0  # perf_counter at step 0 of the run (earlier attempts' time included)
    elapsed_before: float = 0.0  # training time before the checkpoint this attempt resumed
    epoch_part: dict[str, Any] | None = None  # the resumed epoch's measurements before it

    def elapsed(self) -> float:
        """Training time so far, earlier attempts' included."""
        return time.perf_counter() - self.t_start

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps for the record (the ``progress`` entry; the position and
        each rank's rows are kept beside it, see training/checkpoint/state.py)."""
        return {"epochs": [e.to_dict() for e in self.epochs], "tta": self.tta,
                "elapsed_s": self.elapsed(), "warm": sorted(self.warm),
                "resumed": [dict(r) for r in self.resumed], "decided": dict(self.decided)}

    def load_state_dict(self, state: dict[str, Any], unit: Unit = SAMPLES) -> None:
        """Go on from a checkpoint's ``progress`` entry (``unit``: the task's)."""
        self.epochs = [EpochEntry.from_dict(e, unit) for e in state["epochs"]]
        self.tta, self.elapsed_before = state["tta"], float(state["elapsed_s"])
        self.warm = set(state["warm"])
        self.resumed = [dict(r) for r in state["resumed"]]
        # a checkpoint from before ``decided`` holds none: what resolve read from it stands
        self.decided = dict(state.get("decided", self.decided))
