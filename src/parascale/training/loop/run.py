"""What one worker's training builds once (``Run``): its configuration, world, plan and data,
the strategy, model and optimizer, the watches, and where training stands (its ``Progress``,
training/record/progress.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from parascale.training.observe.memory_split import MemorySplit
from parascale.training.record.progress import Progress

if TYPE_CHECKING:
    from parascale.batch import Plan
    from parascale.config import TrainConfig
    from parascale.data.split import DataBundle
    from parascale.runtime import World
    from parascale.runtime.faults import Faults
    from parascale.sync.base import Strategy
    from parascale.tasks import Task
    from parascale.training.checkpoint.resume import Choice
    from parascale.training.checkpoint.writer import CheckpointWriter
    from parascale.training.loop.pruning import TrialPruner
    from parascale.training.observe.contention import CpuWatch
    from parascale.training.observe.divergence import DivergenceWatch
    from parascale.training.observe.noise import NoiseScale
    from parascale.training.observe.phases import StepPhases
    from parascale.training.observe.tensorboard import TensorBoardWriter


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
    phases: StepPhases  # the step clock, and --profile's traces of a window of steps
    cpu: CpuWatch
    noise: NoiseScale  # the gradient noise scale, measured every step
    progress: Progress
    task: Task  # what is trained and how it is judged (parascale.tasks)
    tuning_s: float = 0.0  # the strategy's decisions before training (Strategy.resolve)
    pruner: TrialPruner | None = None  # a hyperparameter search's pruner, in a trial
    checkpoints: CheckpointWriter | None = None  # writes them when due (--checkpoint-every)
    choice: Choice | None = None  # the checkpoint this attempt continued from
    flops: dict | None = None  # the model's counted FLOPs and the devices' peaks (flops.py)
    memory: MemorySplit = field(default_factory=MemorySplit)  # held bytes by category
    tensorboard: TensorBoardWriter | None = None  # --tensorboard's event files, on rank 0
