"""What one configuration costs: its step time, its steps to the goal, its time and its band.

A configuration (:class:`~parascale.advise.space.Candidate`) is N devices at per-device batch
b, accumulating A micro-batches, under one strategy variant: global batch B = N·b·A.

- **Step time**: predict's model (``predict.model.Model``, docs/predict.md) with the variant's
  declared pattern: ``A·compute(b)·k(N) + other + wait(N) + exposed(N)``, where only the last
  micro-batch's backward can hide the exchange.
- **Steps to a target** (McCandlish et al. 2018, An Empirical Model of Large-Batch Training):
  S(B) = S_min·(1 + B_noise/B). One measured S_ref at the reference batch B_ref fixes
  S_min = S_ref / (1 + B_noise/B_ref), so S(B) = S_ref·(1 + B_noise/B)/(1 + B_noise/B_ref).
- **Samples for a budget**: E(B) = E_min·(1 + B/B_noise), the same law in samples; a budget
  stated at B_ref (what the job would spend there) becomes
  E(B) = E_ref·(1 + B/B_noise)/(1 + B_ref/B_noise) at B.
- **Time**, as parascale measures time to target (``time_to_accuracy.elapsed_s``): training
  stops at the evaluation after the epoch that reaches the target, so the steps run are whole
  epochs of ⌊train/B⌋ steps, rounded up to the evaluation cadence, plus one evaluation per
  evaluated epoch (the measured evaluation spread over N devices, and slowed by contention as
  compute is) and the first epoch's extra.
- **The band**: every input with an uncertainty (work, link, noise scale, the steps at the
  reference, evaluation) is set to its low and its high in turn; the relative changes of the
  time are added in quadrature, below and above (independent errors).

Pure arithmetic: nothing here measures, starts or writes anything.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from parascale.batch import steps_per_epoch
from parascale.predict import memory as memory_model
from parascale.predict.model import Input, Model

#: the warm-up advise adds when a rule raises the rate this many times or more (Goyal et al.
#: 2017: large rates diverge early without one) ...
WARMUP_FROM_RATIO = 2.0
#: ... over this share of the steps to the goal (their 5 of 90 epochs)
WARMUP_SHARE = 0.05


@dataclass(frozen=True)
class Figure(Input):
    """One input of the advice (predict's :class:`~parascale.predict.model.Input`: its value,
    how it is known, its source) and its range where it has one."""

    low: float | None = None
    high: float | None = None

    def line(self) -> str:
        if self.low is None or self.high is None:
            return super().line()
        head, _, tail = super().line().partition("  [")
        return f"{head} ({self.low:.4g} to {self.high:.4g})  [{tail}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Memory:
    """What a device holds (predict/memory.py's model) and what it may hold."""

    params: float
    per_parameter: memory_model.PerParameter
    activations_per_sample: float
    overhead: float = 0.0
    """Beyond the model's bytes: on a CPU the process itself (interpreter, torch)."""
    budget: float | None = None
    """Bytes one device may hold; None: not limited."""
    unit: float = 0.0
    """Parameters of FSDP's largest unit (its transients), 0 when unknown."""

    def per_device(self, stage: int, devices: int, batch: int) -> float:
        return memory_model.peak(stage, self.params, devices, self.per_parameter,
                                 self.activations_per_sample * batch, self.unit) + self.overhead

    def fits(self, stage: int, devices: int, batch: int) -> bool:
        return self.budget is None or self.per_device(stage, devices, batch) <= self.budget


@dataclass
class Speed:
    """The throughput side: the calibrated step-time model and how far to trust it."""

    model: Model
    """Calibrated for the default strategy; each variant gets a copy with its own pattern."""
    gradient_bytes: float
    """Bytes of one full-precision gradient (what an uncompressed exchange moves)."""
    memory: Memory
    work_band: float = 0.05
    """Relative uncertainty of the work per step (compute, optimizer)."""
    link_low: float = 1.0
    link_high: float = 1.0
    """The exchange's time may be this many times the modelled one, low and high."""
    precision_scale: dict[str, float] = field(default_factory=dict)
    """Work per step of each searchable precision relative to the measured one (from the
    device's peaks; only where compute comes from FLOPs)."""
    cpu: bool = True


@dataclass
class Statistics:
    """The goal side: how many steps or samples the job needs, and what an epoch costs."""

    reference_batch: int
    lr: float
    """The learning rate at ``reference_batch``."""
    optimizer: str = "sgd"
    noise: float | None = None
    noise_se: float | None = None
    noise_steps: int | None = None
    """The steps the noise scale rests on (for the precision rule)."""
    noise_given: bool = False
    steps: float | None = None
    """Steps to the target at the reference batch (None for a budget)."""
    steps_low: float | None = None
    steps_high: float | None = None
    budget_samples: float | None = None
    """Samples the job would spend at the reference batch (a budget goal)."""
    cap_samples: float | None = None
    """The most samples a run may take to reach the target (the job's epochs or steps)."""
    train_samples: int | None = None
    eval_every: int = 1
    eval_s: float = 0.0
    """One evaluation's time on ``eval_devices`` devices."""
    eval_devices: int = 1
    eval_alone_s: float | None = None
    """One evaluation's time on one device where measured there (the probes): a small
    evaluation's fixed part does not spread over devices, so one device is not taken to need
    ``eval_devices`` times the pilot's."""
    contention: dict[int, float] = field(default_factory=dict)
    """k(N), as the step's compute: an evaluation is compute too, spread over the devices and
    slowed alike where N processes share a machine."""
    first_epoch_s: float = 0.0
    """What the first epoch takes beyond its steps (warm-up of the allocator and caches)."""
    warmup_given: bool = False
    """The job brings its own warm-up: advise adds none."""

    def steps_at(self, batch: float, noise: float | None = None,
                 steps: float | None = None) -> float | None:
        """Steps to the target, or to spend the budget, at global batch ``batch``."""
        noise = self.noise if noise is None else noise
        if self.budget_samples is not None:
            if batch == self.reference_batch:
                return self.budget_samples / batch
            if noise is None:
                return None
            ratio = (1 + batch / noise) / (1 + self.reference_batch / noise)
            return self.budget_samples * ratio / batch
        steps = self.steps if steps is None else steps
        if steps is None:
            return None
        if batch == self.reference_batch:
            return steps
        if noise is None:
            return None
        return steps * (1 + noise / batch) / (1 + noise / self.reference_batch)


def lr_for(batch: float, stats: Statistics, rule: str, noise: float | None = None) -> float:
    """The learning rate at global batch ``batch`` from the rate at the reference batch.

    linear: Goyal et al. 2017; sqrt: Krizhevsky 2014 (and Hoffer et al. 2017 for adaptive
    optimizers); bounded: McCandlish et al. 2018's optimal SGD step ε(B) = ε_max/(1 +
    B_noise/B), linear while B is well below B_noise and level beyond it, its square root for
    AdamW; none: the reference rate."""
    noise = stats.noise if noise is None else noise
    ratio = batch / stats.reference_batch
    if rule == "bounded" and noise is not None:
        ratio = (1 + noise / stats.reference_batch) / (1 + noise / batch)
        return stats.lr * (math.sqrt(ratio) if stats.optimizer == "adamw" else ratio)
    if rule == "linear" or (rule == "bounded" and stats.optimizer != "adamw"):
        return stats.lr * ratio
    if rule in ("sqrt", "bounded"):
        return stats.lr * math.sqrt(ratio)
    return stats.lr


def warmup_steps(lr: float, stats: Statistics, steps: float) -> int:
    """The warm-up advise gives a configuration whose rate is far above the reference's."""
    if stats.warmup_given or lr < WARMUP_FROM_RATIO * stats.lr:
        return 0
    return max(1, round(WARMUP_SHARE * steps))


@dataclass(frozen=True)
class Step:
    """One step's predicted parts (seconds)."""

    step_s: float
    work_s: float
    wait_s: float
    comm_s: float
    exposed_s: float


def step_time(model: Model, devices: int, batch: int, accumulate: int = 1,
              work_scale: float = 1.0, link_scale: float = 1.0) -> Step:
    """The step of ``model`` (its strategy set) on ``devices`` at per-device ``batch``: the
    exchange hides only behind the last micro-batch's backward."""
    compute = model.compute(devices, batch) * work_scale
    work = accumulate * compute + model.work.other_s * work_scale
    comm = model.comm(devices) * link_scale
    exposed = comm
    if model.strategy.overlaps:
        hidden = comm * model.strategy.hideable
        exposed = max(0.0, hidden - model.overlap * compute) + comm - hidden
    wait = model.wait(devices) * work_scale
    return Step(work + wait + exposed, work, wait, comm, exposed)


@dataclass(frozen=True)
class Timing:
    time_s: float
    steps: float
    """Optimizer steps run (whole epochs for a target)."""
    epochs: float | None
    evaluations: int
    reached: bool
    """The goal is met within the job's budget of samples."""


def time_to_goal(stats: Statistics, devices: int, batch: int, step_s: float, steps: float
                 ) -> Timing:
    """Seconds of training until the goal, as parascale measures it (see the module)."""
    per_eval = stats.eval_s * stats.eval_devices / devices * \
        stats.contention.get(devices, 1.0) / stats.contention.get(stats.eval_devices, 1.0)
    if devices == 1 and stats.eval_alone_s is not None:
        per_eval = stats.eval_alone_s
    target = stats.budget_samples is None
    if not stats.train_samples:
        return Timing(steps * step_s, steps, None, 0, True)
    per_epoch = steps_per_epoch(stats.train_samples, batch)
    if per_epoch < 1:
        return Timing(math.inf, steps, None, 0, False)
    every = max(1, stats.eval_every)
    if target:
        epochs = math.ceil(steps / per_epoch / every - 1e-9) * every
        run = epochs * per_epoch
        evaluations = epochs // every
    else:
        run = math.ceil(steps - 1e-9)
        epochs = math.ceil(run / per_epoch)
        evaluations = math.ceil(epochs / every)
    reached = not target or stats.cap_samples is None or run * batch <= stats.cap_samples + 1e-9
    time = run * step_s + evaluations * per_eval + stats.first_epoch_s
    return Timing(time, run, epochs, evaluations, reached)


def combined(centre: float, values: list[tuple[float, float]]) -> tuple[float, float]:
    """The band around ``centre`` from (time at an input's low, at its high) pairs: relative
    changes below and above, each side added in quadrature."""
    if not math.isfinite(centre) or centre <= 0:
        return centre, centre
    down = up = 0.0
    for a, b in values:
        for v in (a, b):
            if not math.isfinite(v):
                up = math.inf
                continue
            change = (v - centre) / centre
            if change < 0:
                down += change * change
            else:
                up += change * change
    return centre * max(0.0, 1 - math.sqrt(down)), centre * (1 + math.sqrt(up))
