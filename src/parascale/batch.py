"""Batch arithmetic: how a batch splits over workers and accumulation steps, the learning rate
it implies, and how many steps it makes of a training set.

Train (validation and the trainer) and bench (its strong-scaling plans) both ask whether a
global batch divides; they ask :func:`indivisible`, so a bad batch gets the same words from
either. Nothing here imports torch or another parascale layer.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parascale.errors import UsageError

if TYPE_CHECKING:
    from parascale.config import TrainConfig

DEFAULT_BATCH = 32  # per device, when neither batch is given


@dataclass(frozen=True)
class Derived:
    """Numbers computed once from a config and the world size, printed at start and recorded."""

    world_size: int
    per_device_batch: int
    global_batch: int
    effective_lr: float
    base_batch: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def indivisible(global_batch: int, workers: int, accumulate: int = 1) -> str | None:
    """Why ``global_batch`` does not split evenly over ``workers`` x ``accumulate``
    micro-batches, or None when it does."""
    if global_batch % (workers * accumulate) == 0:
        return None
    steps = f" x {accumulate} accumulation steps" if accumulate > 1 else ""
    return f"global batch {global_batch} does not divide by {workers} workers{steps}"


def resolve_lr(lr: float, rule: str, global_batch: int, base_batch: int) -> float:
    """The learning rate after the scaling rule: linear (Goyal et al. 2017, Accurate, Large
    Minibatch SGD) or square root (Krizhevsky 2014, One weird trick for parallelizing
    convolutional neural networks)."""
    ratio = global_batch / base_batch
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    return lr


def derive(cfg: TrainConfig, world_size: int, replicas: int = 1) -> Derived:
    """Per-device and effective batch, and the effective learning rate, for this world size.
    ``replicas``: model replicas a device trains at once, each on its own ``--batch-size``
    (the strategy's ``replicas_per_device``: SMA's learners), so a device takes that many
    batches a step: ``sync.strategy_of(cfg).replicas_per_device(cfg)``."""
    micro = world_size * cfg.batch.accumulate
    if cfg.batch.global_batch is not None:
        reason = indivisible(cfg.batch.global_batch, world_size, cfg.batch.accumulate)
        if reason:
            raise UsageError(f"{reason}; try "
                             f"{max(micro, cfg.batch.global_batch // micro * micro)}")
        per_device = cfg.batch.global_batch // micro
        global_batch = cfg.batch.global_batch
    else:
        per_device = (cfg.batch.batch_size or DEFAULT_BATCH) * replicas
        global_batch = per_device * micro
    base = cfg.optim.base_batch or per_device
    return Derived(world_size=world_size, per_device_batch=per_device, global_batch=global_batch,
                   effective_lr=resolve_lr(cfg.optim.lr, cfg.optim.lr_scaling, global_batch, base),
                   base_batch=base)


def steps_per_epoch(n_samples: int, global_batch: int) -> int:
    """Whole global batches in the training set: the last incomplete one is dropped, so every
    rank runs the same number of steps (uneven counts hang collectives)."""
    return n_samples // global_batch


@dataclass
class Plan:
    """Step arithmetic fixed before the first step."""

    derived: Derived
    steps_per_epoch: int
    total_steps: int
    epochs: int
    warmup_steps: int
    train_samples: int
    test_samples: int

    def record_section(self) -> dict:
        """The record's ``derived`` numbers that are fixed before the first step."""
        return {**self.derived.to_dict(), "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps, "train_samples": self.train_samples,
                "test_samples": self.test_samples}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the launcher hands its plan to the workers (``contract.PLAN``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        return cls(**{**data, "derived": Derived(**data["derived"])})


def make_plan(cfg: TrainConfig, world_size: int, n_train: int, n_test: int, *,
              replicas: int) -> Plan:
    """The step arithmetic of a run (``replicas``: see :func:`derive`; required, so that no
    caller plans without asking the strategy). Made once, by the launcher from the data it
    checked, and handed to the workers."""
    derived = derive(cfg, world_size, replicas=replicas)
    per_epoch = steps_per_epoch(n_train, derived.global_batch)
    total = cfg.batch.steps if cfg.batch.steps is not None else per_epoch * (cfg.batch.epochs or 3)
    epochs = math.ceil(total / per_epoch) if per_epoch else 0
    warmup = cfg.optim.warmup_steps or round(cfg.optim.warmup_epochs * per_epoch)
    return Plan(derived, per_epoch, total, epochs, warmup, n_train, n_test)
