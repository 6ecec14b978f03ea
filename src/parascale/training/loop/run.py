"""A worker's run in two parts: what is built once (``Run``: data, model, optimizer, strategy,
the watches) and where training stands (``Progress``: steps, epochs, measurements so far).

``Progress`` is the one owner of the run's state: the loop advances it, a checkpoint saves what
its ``state_dict`` returns (and each rank's step rows), and a resume puts it back through
``load_state_dict`` (training/checkpoint/state.py), the way torchtitan's checkpointer treats its
``Stateful`` components. ``Summary`` is what the finished run hands to the record
(training/record/assemble.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from parascale.runrecord import SAMPLES, EpochEntry, Unit
from parascale.training.observe.measure import Steady
from parascale.training.observe.memory_split import MemorySplit

if TYPE_CHECKING:
    from parascale.batch import Plan
    from parascale.config import TrainConfig
    from parascale.data.split import DataBundle
    from parascale.tasks import Task
    from parascale.runtime import World
    from parascale.runtime.faults import Faults
    from parascale.sync.base import Strategy
    from parascale.training.observe.tensorboard import Board
    from parascale.training.observe.contention import CpuWatch
    from parascale.training.observe.divergence import DivergenceWatch
    from parascale.training.checkpoint.writer import Keeper
    from parascale.training.observe.measure import StepClock
    from parascale.training.observe.noise import NoiseScale
    from parascale.training.observe.profiling import Profiler
    from parascale.training.loop.pruning import Judge
    from parascale.training.checkpoint.resume import Choice

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


@dataclass
class Run:
    """What one worker's training builds once, from set-up to summary, and its progress."""

    cfg: TrainConfig
    world: World
    plan: Plan
    bundle: DataBundle
    strategy: Strategy
    net: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    faults: Faults
    divergence: DivergenceWatch
    clock: StepClock
    cpu: CpuWatch
    profiler: Profiler  # --profile: traces of a window of steps
    noise: NoiseScale  # the gradient noise scale, measured every step
    progress: Progress
    task: Task  # what is trained and how it is judged (parascale.tasks)
    tuning_s: float = 0.0  # the strategy's decisions before training (Strategy.resolve)
    judge: Judge | None = None  # a hyperparameter search's pruner, in a trial
    keeper: Keeper | None = None  # writes checkpoints when due (--checkpoint-every)
    choice: Choice | None = None  # the checkpoint this attempt continued from
    flops: dict | None = None  # the model's counted FLOPs and the devices' peaks (flops.py)
    memory: MemorySplit = field(default_factory=MemorySplit)  # held bytes by category
    board: Board | None = None  # --tensorboard's event files, on rank 0


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
