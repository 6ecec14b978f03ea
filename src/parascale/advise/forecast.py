"""Every candidate's prediction (:class:`Forecast`) from what advise knows (:class:`Basis`):
throughput, efficiency, memory per device, steps and time to the goal with its band, and
device-hours. The arithmetic is :mod:`parascale.advise.model`'s; this module applies it to
one candidate with each input at its value, its low and its high."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from parascale.advise.model import (Figure, Speed, Statistics, Step, Timing, combined, lr_for,
                                    step_time, time_to_goal, warmup_steps)
from parascale.advise.space import Candidate, Variant
from parascale.predict import costs
from parascale.predict.calibrate import buckets_for
from parascale.predict.model import Model


@dataclass
class Basis:
    """Everything a prediction rests on, with the inputs as printed."""

    subject: str
    speed: Speed
    stats: Statistics
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measured: list[str] = field(default_factory=list)
    """One line per measurement made here: what, how long, on a quiet or busy machine."""
    wire: dict[str, float | None] = field(default_factory=dict)
    """Bytes a variant puts on the wire per exchange (compression), by its label; a label
    missing here moves the full-precision gradient."""
    unit: str = "samples"
    units_per_sample: float = 1.0
    threads: int | None = None
    """Here: the threads every worker was measured with, and runs with (cores / workers)."""
    _models: dict[str, Model] = field(default_factory=dict, repr=False)

    def model_of(self, variant: Variant) -> Model | None:
        """predict's model with the variant's pattern and bytes (None: bytes unknown)."""
        if variant.label not in self._models:
            size = self.wire.get(variant.label, self.speed.gradient_bytes)
            if size is None:
                return None
            base = self.speed.model
            strategy = costs.Strategy.of(variant.name, variant.pattern)
            self._models[variant.label] = dataclasses.replace(
                base, strategy=strategy, gradient_bytes=size,
                buckets=buckets_for(size) if strategy.overlaps else 1, inputs=[])
        return self._models[variant.label]


@dataclass(frozen=True)
class Forecast:
    candidate: Candidate
    lr: float
    warmup_steps: int
    step: Step | None
    throughput: float
    efficiency: float
    memory_bytes: float
    fits: bool
    timing: Timing | None
    low_s: float
    high_s: float
    why_not: str | None = None
    """Why it cannot be chosen, read after "it": "needs 90 GiB per device, ...", "does not
    reach the goal within the job's budget"."""
    expected_s: float | None = None
    """The time averaged over the steps' uncertainty (whole epochs make it a staircase)."""

    @property
    def time_s(self) -> float:
        if self.expected_s is not None:
            return self.expected_s
        return self.timing.time_s if self.timing is not None else math.inf

    @property
    def device_hours(self) -> float:
        return self.candidate.devices * self.time_s / 3600

    @property
    def feasible(self) -> bool:
        return self.why_not is None

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        t = self.timing
        return {"devices": c.devices, "per_device_batch": c.per_device_batch,
                "accumulate": c.accumulate, "global_batch": c.global_batch,
                "strategy": c.variant.name, "options": c.variant.options,
                "precision": c.precision, "exact_steps": c.variant.exact, "lr": self.lr,
                "warmup_steps": self.warmup_steps,
                "step_s": self.step.step_s if self.step else None,
                "exposed_s": self.step.exposed_s if self.step else None,
                "throughput": self.throughput, "efficiency": self.efficiency,
                "memory_bytes": self.memory_bytes, "fits": self.fits,
                "steps": t.steps if t else None, "epochs": t.epochs if t else None,
                "time_s": _finite(self.time_s), "low_s": _finite(self.low_s),
                "high_s": _finite(self.high_s), "device_hours": _finite(self.device_hours),
                "feasible": self.feasible, "why_not": self.why_not}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _timing(c: Candidate, basis: Basis, model: Model, rule: str, *, work: float = 1.0,
            link: float = 1.0, noise: float | None = None, steps: float | None = None,
            evaluation: float = 1.0) -> tuple[Step, float, int, Timing | None]:
    speed, stats = basis.speed, basis.stats
    scale = speed.precision_scale.get(c.precision, 1.0)
    step = step_time(model, c.devices, c.per_device_batch, c.accumulate, work * scale, link)
    batch = c.global_batch
    lr = lr_for(batch, stats, rule, noise)
    needed = stats.steps_at(batch, noise, steps)
    if needed is None:
        return step, lr, 0, None
    warm = warmup_steps(lr, stats, needed)
    if evaluation != 1.0:
        stats = dataclasses.replace(stats, eval_s=stats.eval_s * evaluation)
    return step, lr, warm, time_to_goal(stats, c.devices, batch, step.step_s,
                                        needed + warm / 2)


#: the relative uncertainty of one evaluation's time, spread over N devices (assumed)
EVALUATION_BAND = 0.2


def forecast(c: Candidate, basis: Basis, rule: str) -> Forecast:
    speed, stats = basis.speed, basis.stats
    model = basis.model_of(c.variant)
    stage, n, b = c.variant.stage, c.devices, c.per_device_batch
    held = speed.memory.per_device(stage, n, b)
    fits = speed.memory.fits(stage, n, b)
    if model is None:
        return Forecast(c, stats.lr, 0, None, 0.0, 0.0, held, fits, None, math.inf, math.inf,
                        "puts bytes on the wire that cannot be counted without the model")
    step, lr, warm, timing = _timing(c, basis, model, rule)
    scale = speed.precision_scale.get(c.precision, 1.0)
    alone = step_time(model, 1, b, c.accumulate, scale).step_s  # one device, no exchange
    throughput = c.global_batch / step.step_s
    efficiency = throughput / (n * c.accumulate * b / alone)
    why = None
    if not fits:
        limit = speed.memory.budget or 0
        why = (f"needs {held / 2**30:.3g} GiB per device, over the {limit / 2**30:.3g} GiB it "
               "may hold")
    elif timing is None:
        why = "needs the gradient noise scale for its steps at this global batch"
    elif not timing.reached:
        why = "does not reach the goal within the job's budget"
    low = high = math.inf
    expected = None
    if timing is not None and math.isfinite(timing.time_s):
        pairs = []

        def time_of(**kwargs: float) -> float:
            found = _timing(c, basis, model, rule, **kwargs)[3]
            return found.time_s if found is not None else math.inf

        expected = _expected(c, basis, step.step_s, warm)

        pairs.append((time_of(work=1 - speed.work_band), time_of(work=1 + speed.work_band)))
        if n > 1:
            pairs.append((time_of(link=speed.link_low), time_of(link=speed.link_high)))
        if stats.noise is not None and stats.noise_se:
            pairs.append((time_of(noise=max(stats.noise - stats.noise_se, stats.noise * 0.05)),
                          time_of(noise=stats.noise + stats.noise_se)))
        if stats.steps_low is not None and stats.steps_high is not None:
            pairs.append((time_of(steps=max(stats.steps_low, 1e-9)),
                          time_of(steps=stats.steps_high)))
        if stats.eval_s:
            pairs.append((time_of(evaluation=1 - EVALUATION_BAND),
                          time_of(evaluation=1 + EVALUATION_BAND)))
        low, high = combined(timing.time_s, pairs)
        low, high = min(low, expected), max(high, expected)
    return Forecast(c, lr, warm, step, throughput, efficiency, held, fits, timing, low, high,
                    why, expected)


#: points of the steps' distribution the expected time averages over
POINTS = 16


def steps_band(batch: int, stats: Statistics) -> tuple[float, float, float] | None:
    """(low, central, high) steps to the goal at ``batch`` from the noise scale's and the
    reference steps' uncertainty, added in quadrature."""
    central = stats.steps_at(batch)
    if central is None or central <= 0:
        return None
    pairs = []
    if stats.noise is not None and stats.noise_se:
        pairs.append((stats.steps_at(batch, max(stats.noise - stats.noise_se,
                                                 stats.noise * 0.05)),
                      stats.steps_at(batch, stats.noise + stats.noise_se)))
    if stats.steps_low is not None and stats.steps_high is not None:
        pairs.append((stats.steps_at(batch, steps=max(stats.steps_low, 1e-9)),
                      stats.steps_at(batch, steps=stats.steps_high)))
    low, high = combined(central, [(a or central, b or central) for a, b in pairs])
    return max(low, 1e-9), central, high


def _expected(c: Candidate, basis: Basis, step_s: float, warm: int) -> float:
    """The time to the goal averaged over a triangular distribution of the steps between their
    low, central and high figures: the measured time is a staircase in whole epochs, and a
    prediction near a step of it is as likely to land on either side."""
    stats = basis.stats
    band = steps_band(c.global_batch, stats)
    if band is None:
        return math.inf
    a, m, b = band
    times = []
    for j in range(POINTS):
        u = (j + 0.5) / POINTS
        if b - a <= 0:
            steps = m
        elif u < (m - a) / (b - a):
            steps = a + math.sqrt(u * (b - a) * (m - a))
        else:
            steps = b - math.sqrt((1 - u) * (b - a) * (b - m))
        times.append(time_to_goal(stats, c.devices, c.global_batch, step_s,
                                  steps + warm / 2).time_s)
    return sum(times) / len(times)
