"""Interconnects as latency α (seconds per message) and inverse bandwidth β (seconds per byte).

An interconnect is either fitted to a ``parascale comm`` record (measured on the user's own
machine) or one of a few named presets. The presets are nominal figures with their source: a
link's data sheet gives β, and α is an order of magnitude for a small collective's step on that
link (per-hop software latency, not the wire's), so a preset is always reported as *assumed*.

The fit: ``parascale comm`` times allreduce at several sizes S on n workers. The ring model
``t = 2(n−1)·α + 2((n−1)/n)·S·β`` is linear in (α, β), so α and β come from least squares over
the rows. The rows span five orders of magnitude of time, so each is weighted by 1/t (relative
error): unweighted, the largest message alone would decide α, which could come out negative.
Neither may be negative: if one does, it is fixed at 0 and the other refitted.

A straight line is a rough fit for gloo, whose allreduce changes algorithm with the message size
(on the development machine 1 MiB took longer per byte than 4 MiB). So a fitted link also keeps
its measured allreduce times: :meth:`Link.correction` is the ratio of the measured time
(interpolated linearly between the two nearest sizes) to the fitted one at a message size,
and the model multiplies a ring exchange by it, carrying what the fit missed at that size on
the measured world to every N. Outside the measured sizes it is 1 (the fit alone).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from parascale.errors import UsageError
from parascale.predict import limits
from parascale.record import COMM_SCHEMA


@dataclass(frozen=True)
class Link:
    """One interconnect in the α-β model."""

    name: str
    alpha_s: float
    """Latency per message (s)."""
    beta_s_per_byte: float
    """Inverse bandwidth (s per byte): 1 / bytes per second."""
    how: str
    """"measured" (fitted to a comm record) or "assumed" (a preset)."""
    source: str
    """Where the figures come from, one sentence."""
    fit: dict[str, Any] | None = field(default=None, compare=False)
    """For a fitted link: world size, rows used, residuals, the comm record's backend."""
    times: tuple[tuple[float, float], ...] = field(default=(), compare=False)
    """A fitted link's measured allreduce (bytes, seconds) on ``fit["world_size"]`` ranks."""

    def predicted(self, n: int, size: float) -> float:
        a, b = ring_terms("allreduce", n, size)
        return a * self.alpha_s + b * self.beta_s_per_byte

    def correction(self, size: float) -> float:
        """Measured / fitted allreduce time at ``size`` bytes (1 outside the measured sizes)."""
        points = sorted(self.times)
        if len(points) < 2 or not points[0][0] <= size <= points[-1][0] or not self.fit:
            return 1.0
        n = self.fit["world_size"]
        for (s0, t0), (s1, t1) in zip(points, points[1:]):
            if s0 <= size <= s1:
                w = 0.0 if s1 == s0 else (size - s0) / (s1 - s0)
                measured = (1 - w) * t0 + w * t1  # linear in bytes: exact for α + S·β
                fitted = self.predicted(n, size)
                return measured / fitted if fitted > 0 else 1.0
        return 1.0

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return math.inf if self.beta_s_per_byte == 0 else 1.0 / self.beta_s_per_byte

    def figures(self) -> str:
        bw = self.bandwidth_bytes_per_s
        bw_text = "unbounded" if math.isinf(bw) else f"{bw / 1e9:.3g} GB/s"
        return f"{self.name}: α = {self.alpha_s * 1e6:.3g} us, 1/β = {bw_text}"

    def describe(self) -> str:
        return f"{self.figures()} ({self.how}: {self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "alpha_s": self.alpha_s,
                "beta_s_per_byte": self.beta_s_per_byte,
                "bandwidth_bytes_per_s": None if self.beta_s_per_byte == 0
                else self.bandwidth_bytes_per_s,
                "how": self.how, "source": self.source, "fit": self.fit}


def _preset(name: str, alpha_us: float, gb_per_s: float, source: str) -> Link:
    return Link(name, alpha_us * 1e-6, 1.0 / (gb_per_s * 1e9), "assumed", source)


# Bandwidths are per direction, in 10^9 bytes per second, as the sources state them.
PRESETS: dict[str, Link] = {p.name: p for p in (
    _preset("nvlink", 10.0, 300.0,
            "NVLink 3 (A100 SXM): 12 links x 25 GB/s per direction = 300 GB/s, NVIDIA A100 data "
            "sheet (600 GB/s both directions); alpha ~10 us, the order of NCCL's small-message "
            "allreduce time in nccl-tests"),
    _preset("pcie", 10.0, 15.75,
            "PCIe 3.0 x16: 8 GT/s x 16 lanes x 128/130 encoding = 15.75 GB/s per direction "
            "(PCI-SIG base specification 3.0); alpha ~10 us assumed"),
    _preset("ib100", 5.0, 12.5,
            "InfiniBand EDR: 100 Gb/s = 12.5 GB/s per direction (InfiniBand Trade Association "
            "roadmap); alpha ~5 us assumed for MPI/NCCL over it (the wire is ~1 us)"),
    _preset("25gbe", 30.0, 3.125,
            "25 Gigabit Ethernet (IEEE 802.3by): 25 Gb/s = 3.125 GB/s per direction, the network "
            "of Horovod's 512-GPU figures (Sergeev and Del Balso, 'Horovod: fast and easy "
            "distributed deep learning in TensorFlow', arXiv:1802.05799, 2018); alpha ~30 us "
            "assumed for TCP"),
    _preset("loopback", 150.0, 1.2,
            "gloo over loopback between 2 CPU processes, fitted once from 'parascale comm "
            "--workers 2' on the development machine (2 shared cores, 2026-11-24): alpha "
            "~150 us, ~1.2 GB/s; another machine will differ, measure it with parascale comm"),
)}


def preset(name: str) -> Link:
    """A named preset, or one line listing the known ones."""
    if name not in PRESETS:
        raise UsageError(f"--interconnect: unknown preset {name!r}; known presets: "
                         f"{', '.join(PRESETS)} (or --comm DIR to fit one from a "
                         "'parascale comm' record)")
    return PRESETS[name]


def ring_terms(op: str, n: int, size: float) -> tuple[float, float]:
    """(count of α, bytes times β) in the time of one collective of ``size`` bytes on n ranks,
    for the operations a comm record holds. Allreduce: ring (reduce-scatter + all-gather);
    all-gather: ring, S being the gathered output; broadcast and reduce: pipelined, S once."""
    if op == "allreduce":
        return 2 * (n - 1), 2 * (n - 1) / n * size
    if op == "all_gather":
        return n - 1, (n - 1) / n * size
    return 1.0, size


def fit_rows(rows: list[tuple[str, int, float, float]]) -> tuple[float, float, float]:
    """α, β and the largest relative residual from (op, n, bytes, seconds) rows: least squares
    weighted by 1/t, α and β kept non-negative."""
    import numpy as np

    terms = np.array([ring_terms(op, n, size) for op, n, size, _ in rows], dtype=float)
    t = np.array([row[3] for row in rows], dtype=float)
    a, w = terms / t[:, None], np.ones_like(t)  # each row divided by its own time
    solution = np.linalg.lstsq(a, w, rcond=None)[0]
    if solution[0] < 0 or solution[1] < 0:  # refit with the negative one held at zero
        keep = 1 if solution[0] < 0 else 0
        only = float(np.linalg.lstsq(a[:, keep:keep + 1], w, rcond=None)[0][0])
        solution = np.array([0.0, max(only, 0.0)] if keep == 1 else [max(only, 0.0), 0.0])
    alpha, beta = float(solution[0]), float(solution[1])
    worst = float(np.max(np.abs(terms @ solution - t) / t))
    return alpha, beta, worst


def fit_comm(record: Any, where: str = "--comm") -> Link:
    """The α-β link fitted to a ``parascale comm`` record's allreduce rows (the collective the
    gradient strategies use); all-gather, broadcast and reduce rows are used only when a record
    has no allreduce rows."""
    if not isinstance(record, dict) or record.get("schema") != COMM_SCHEMA:
        raise UsageError(f"{where}: not a parascale comm record (no \"schema\": "
                         f"\"{COMM_SCHEMA}\"); make one with "
                         "'parascale comm --workers N --out DIR'")
    n = record.get("world_size")
    results = record.get("results")
    if not isinstance(n, int) or n < 2 or not isinstance(results, list):
        raise UsageError(f"{where}: the comm record has no world_size of 2 or more, or no "
                         "results; measure again with 'parascale comm --workers N'")
    limits.field(where, "world_size", n, 2, limits.MAX_COUNT, "workers")
    rows = []
    for i, r in enumerate(results):
        if not isinstance(r, dict) or r.get("op") not in ("allreduce", "all_gather", "broadcast",
                                                          "reduce"):
            continue
        size, (name, time) = r.get("bytes"), row_time(r)
        if not (_positive(size) and _positive(time)):
            continue  # a row that measured nothing
        rows.append((r["op"], n,
                     limits.field(where, f"results[{i}].bytes", size, 1, limits.MAX_BYTES,
                                  "bytes"),
                     limits.field(where, f"results[{i}].{name}", time, 1e-12, limits.MAX_SECONDS,
                                  "seconds")))
    used = [r for r in rows if r[0] == "allreduce"] or rows
    if len({r[2] for r in used}) < 2:
        raise UsageError(f"{where}: the comm record has {len(used)} usable row(s) at "
                         f"{len({r[2] for r in used})} size(s); fitting latency and bandwidth "
                         "needs at least 2 sizes (parascale comm --sizes 1K,1M,16M)")
    alpha, beta, worst = fit_rows(used)
    env = record.get("environment") if isinstance(record.get("environment"), dict) else {}
    backend = env.get("backend") if isinstance(env.get("backend"), str) else "unknown"
    ops = sorted({r[0] for r in used})
    sizes = sorted({int(r[2]) for r in used})
    fit = {"world_size": n, "ops": ops, "rows": len(used), "sizes_bytes": [sizes[0], sizes[-1]],
           "max_relative_residual": worst, "backend": backend,
           "hosts": env.get("hosts") if isinstance(env.get("hosts"), list) else None,
           "method": "weighted least squares (weights 1/t) of the ring model, alpha, beta >= 0"}
    means = all(_positive(r.get("mean_s")) for r in results if isinstance(r, dict)
                and r.get("op") in ops)
    fit["statistic"] = "mean" if means else "median"
    source = (f"fitted to {len(used)} {'/'.join(ops)} rows of a comm record ({n} workers, "
              f"{backend}, {_size(sizes[0])}-{_size(sizes[-1])}, each row's "
              f"{fit['statistic']} iteration; worst row off by {worst:.0%})")
    times = tuple(sorted((r[2], r[3]) for r in used if r[0] == "allreduce"))
    return Link("measured", alpha, beta, "measured", source, fit, times)


def row_time(row: dict) -> tuple[str, Any]:
    """A comm row's time for the fit: its mean iteration where the record has it (a training
    step pays the mean exchange, the iterations a busy machine preempted included, as the
    model's other phases are means), else the median (records before ``mean_s``)."""
    if _positive(row.get("mean_s")):
        return "mean_s", row["mean_s"]
    return "time_s", row.get("time_s")


def _positive(value: Any) -> bool:
    """A number above 0, infinite or huge included (those are refused by name)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _size(n: int) -> str:
    for unit, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= factor:
            return f"{n / factor:g}{unit}"
    return f"{n}B"
