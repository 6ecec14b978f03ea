"""The step-time model: what one data-parallel step costs on N devices.

A step on N devices at per-device batch b is

    t(N, b) = work(b) + wait(N) + exposed(N, b)
    work(b) = compute(b) + other             (compute: data + forward + backward;
                                              other: optimizer step and the rest of the step)
    compute at N = compute(b)·k(N)           k(N): a study's contention baseline at N (same
                                              processes, no exchange) over compute(b); else 1
    wait(N) = (E[max of N works] − mean) / √H (waiting for the slowest of N devices, from the
                                              measured per-step work quantiles; older records:
                                              σ·g(N) / √H, below)
    exposed = max(0, C(N) − φ·compute(b))    for a strategy that overlaps with backward (DDP)
            = C(N)                           for one that exchanges after backward

with C(N) the strategy's exchange time per step (:mod:`parascale.predict.costs`) and φ the share
of compute behind which communication can hide. A synchronous exchange starts when the last
device is ready: with per-step compute times of spread σ (taken as normal and independent
across devices), the slowest of N is on average σ·g(N) later than the mean one, g(N) = E[max of N
standard normals] ≈ Φ⁻¹((N − 0.375)/(N + 0.25)) (Blom 1958; 0.59 at N = 2, 2.0 at 8, 3.9 at
4096). A strategy that synchronises every H steps waits for the slowest sum of H steps, whose
spread is σ·√H: σ·g(N)/√H per step. Throughput is N·b / t, speedup
X_N / X_1 (t(1, b1) has no exchange: one device trains alone) and efficiency speedup / N, which
is t1/tN under weak scaling (b fixed) and t1/(N·tN) under strong scaling (N·b fixed).

Statistical efficiency (McCandlish et al. 2018, An Empirical Model of Large-Batch Training):
with a gradient noise scale B_noise, the optimizer steps to a given loss grow as
S_min·(1 + B_noise/B) for a global batch B. When it is known, each point also gives the steps
relative to one device (``steps_factor``) and the time-to-accuracy speedup: the throughput
speedup divided by the extra samples the larger batch needs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from parascale.predict import costs
from parascale.predict import wait
from parascale.predict.interconnect import Link
from parascale.predict.wait import expected_max

MODES = ("weak", "strong")


@dataclass(frozen=True)
class Input:
    """One figure a prediction rests on, and how it is known."""

    name: str
    value: Any
    unit: str
    how: str
    """measured | fitted | counted | given | assumed"""
    source: str

    def line(self) -> str:
        value = f"{self.value:.4g}" if isinstance(self.value, (int, float)) \
            and not isinstance(self.value, bool) else str(self.value)
        return f"{self.name} = {value}{' ' + self.unit if self.unit else ''}  " \
               f"[{self.how}] {self.source}"


@dataclass(frozen=True)
class Work:
    """Per-device work of a step without exchange: ``compute(b) = fixed + per_sample·b``."""

    per_sample_s: float
    fixed_s: float
    other_s: float
    """Optimizer step and the rest of the step (does not scale with the batch)."""

    def compute(self, batch: float) -> float:
        return self.fixed_s + self.per_sample_s * batch

    def total(self, batch: float) -> float:
        return self.compute(batch) + self.other_s


@dataclass(frozen=True)
class Point:
    """One predicted configuration."""

    mode: str
    workers: int
    per_device_batch: float
    global_batch: float
    work_s: float
    """Everything but the exchange: data, forward, backward, optimizer."""
    comm_s: float
    """The exchange's modelled time per step, hidden or not."""
    exposed_s: float
    wait_s: float
    """Waiting for the slowest device (stragglers), per step."""
    step_s: float
    throughput: float
    speedup: float
    efficiency: float
    steps_factor: float | None = None
    tta_speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Model:
    work: Work
    gradient_bytes: float
    strategy: costs.Strategy
    link: Link
    overlap: float
    """φ: share of compute(b) that communication can hide behind (overlapping strategies)."""
    buckets: int = 1
    """Messages per exchange (DDP's buckets), each paying the latency α."""
    intra: Link | None = None
    per_node: int | None = None
    noise_scale: float | None = None
    spread_s: float = 0.0
    """σ: standard deviation of one device's per-step compute time (records without
    ``work_shape``)."""
    work_shape: tuple[float, ...] = ()
    """Quantiles (levels 0..1, evenly spaced) of one device's per-step work less its mean, as
    measured; when present the wait is taken from them (:mod:`parascale.predict.wait`)."""
    work_samples: int = 0
    """The steps behind ``work_shape``."""
    contention: dict[int, float] = field(default_factory=dict)
    """Per N: a study's contention baseline's measured compute over the reference compute at
    the same per-device batch (N processes sharing a machine slow each other's compute);
    an N not in it keeps the reference compute (:mod:`parascale.predict.contention`)."""
    exchange_scale: float = 1.0
    """The records' exposed exchange over the modelled one, where a run that hid none of it
    still took longer than the link's line says (:func:`parascale.predict.calibrate.exchange`);
    1 otherwise."""
    inputs: list[Input] = field(default_factory=list)

    def compute(self, n: int, batch: float) -> float:
        return self.work.compute(batch) * self.contention.get(n, 1.0)

    def work_s(self, n: int, batch: float) -> float:
        return self.compute(n, batch) + self.work.other_s

    def wait(self, n: int) -> float:
        if self.work_shape:
            return wait.wait(self.work_shape, self.work_samples, n) / \
                math.sqrt(self.strategy.every)
        if n <= 1 or self.spread_s <= 0:
            return 0.0
        return self.spread_s * expected_max(n) / math.sqrt(self.strategy.every)

    def comm(self, n: int) -> float:
        messages = self.buckets if self.strategy.overlaps else 1
        time = costs.per_step(self.strategy, n, self.gradient_bytes, self.link,
                              buckets=messages, intra=self.intra, per_node=self.per_node)
        return time * self.correction * self.exchange_scale

    @property
    def correction(self) -> float:
        """What a fitted link's line missed at this message size (see Link.correction): for
        flat ring exchanges, the only ones its allreduce rows measured."""
        if self.strategy.algorithm != "ring" or self.per_node is not None:
            return 1.0
        return self.link.correction(self.gradient_bytes / self.buckets)

    def exposed(self, n: int, batch: float) -> float:
        c = self.comm(n)
        if self.strategy.overlaps:  # what follows the update (ZeRO-1's broadcast) never hides
            hidden = c * self.strategy.hideable
            return max(0.0, hidden - self.overlap * self.compute(n, batch)) + c - hidden
        return c

    def step(self, n: int, batch: float) -> float:
        return self.work_s(n, batch) + self.wait(n) + self.exposed(n, batch)

    def point(self, mode: str, n: int, batch: float, reference_batch: float) -> Point:
        """N devices at per-device ``batch``; the reference is one device at ``reference_batch``
        (the same b under weak scaling, the whole global batch under strong scaling)."""
        step = self.step(n, batch)
        throughput = n * batch / step
        one = reference_batch / self.work.total(reference_batch)
        speedup = throughput / one
        steps_factor = tta = None
        if self.noise_scale:
            steps_factor = (1 + self.noise_scale / (n * batch)) / \
                (1 + self.noise_scale / reference_batch)
            tta = speedup / (steps_factor * n * batch / reference_batch)
        return Point(mode, n, batch, n * batch, self.work_s(n, batch), self.comm(n),
                     self.exposed(n, batch), self.wait(n), step, throughput, speedup, speedup / n,
                     steps_factor, tta)

    def curve(self, mode: str, workers: list[int], batch: float,
              global_batch: float | None = None) -> list[Point]:
        """Weak: per-device ``batch`` on every N. Strong: ``global_batch`` (default ``batch``)
        split over N; an N with less than one sample per device is left out."""
        if mode == "weak":
            return [self.point(mode, n, batch, batch) for n in workers]
        total = global_batch or batch
        return [self.point(mode, n, total / n, total) for n in workers if total / n >= 1]


def overlap_from(measured_exposed_s: float, comm_s: float, compute_s: float) -> float:
    """φ from a run that overlapped: the part of the modelled exchange that did not show as
    exposed sync, as a share of compute (0 to 1)."""
    if compute_s <= 0 or not math.isfinite(measured_exposed_s):
        return 0.0
    return min(1.0, max(0.0, (comm_s - measured_exposed_s) / compute_s))
