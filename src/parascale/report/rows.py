"""Summary rows computed from run records: medians, spreads, intervals, speedup and efficiency.

Definitions (also printed with every table):

- X_N: global steady throughput, ``summary.steady_throughput`` (samples/s over the slowest rank,
  warm-up epoch excluded). Per-device throughput is X_N / N.
- Reference: the 1-worker row of a group if it has one, else its smallest N (N_ref), and then the
  table says "relative to N_ref workers". The reference row itself then shows no speedup: its
  own would only restate the assumption that N_ref workers scaled perfectly, so it is never
  printed as a measurement, and a group with one worker count has no speedup at all.
- Speedup S_N = X_N / X_1, only against a measured 1-worker run; efficiency E_N = S_N / N.
  Without a 1-worker run there is no speedup (N_ref * X_N / X_ref would assume that N_ref
  workers scaled perfectly): the tables show the measured ratio X_N / X_ref "vs N_ref" and the
  relative efficiency E_N = N_ref * X_N / (N * X_ref), both said to be relative to N_ref.
  For weak scaling that is E = t1/tN, for strong scaling E = t1/(N*tN), t being the time per step:
  the same number as X_N/(N*X_1), so one computation serves both. Efficiency is never capped at
  100 %: super-linear results happen (caches) and hiding them would hide a finding.
- Sync cost, where a baseline run exists for the same group and N (``study.baseline``: same
  processes, gradients never exchanged): 1 - X_sync / X_baseline, and the difference of the
  median step times (``steps.phases.step.p50``).
- Lost efficiency, split (where there is a baseline): ideal -> baseline -> measured. With
  X_b the baseline's throughput, ``contention`` = 1 - N_ref*X_b/(N*X_ref) is what N processes
  sharing the machine cost without exchanging anything, and ``exchange`` =
  N_ref*(X_b - X_s)/(N*X_ref) what gradient exchange costs on top; they add up to 1 - E.
- Repeats (same group and N): the median of each figure, with min-max and the count n.

Spread and intervals (how noisy a figure is, and when a difference is only noise):

- The spread of a row's throughput is the min-max over its n runs (run medians) when it has
  repeats. With a single run it is the min-max over that run's steady epochs (warm-up and
  partial epochs excluded; n is then the number of epochs, shown as "1 (4 ep)"): that shows
  how much the run itself wandered, and understates run-to-run noise, which only repeats show.
  One run with one steady epoch has no spread: its figures are marked as such.
- A derived figure (speedup, efficiency, sync cost, the lost-efficiency split) gets the
  conservative interval: the formula evaluated at every combination of its inputs' minima and
  maxima, taking the lowest and highest result (each formula is monotonic in each input, so
  these corners bound it). For a ratio of two medians with ranges that is [min/max, max/min].
  No distribution is assumed, which suits the 2-5 repeats studies afford; it is wide by design.
- A figure whose interval contains its no-difference value (speedup X_N/X_ref = 1, efficiency
  100 %, a cost or a lost share of 0) is *within noise*: marked "~" in the tables and never
  stated as a result in the sentences (a negative sync cost is "not measurable here").
"""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Callable, Iterable, NamedTuple

from parascale.report.load import RunRecord
from parascale.report.series import variants

FORMULAS = {
    "weak": "E = t1/tN (t = time per step, per-device batch fixed)",
    "strong": "E = t1/(N·tN) (t = time per step, global batch fixed)",
    None: "E = X_N/(N·X_1) (X = global steady throughput; scaling mode not recorded)",
}
SPEEDUP = "S = X_N/X_1, E = S/N"
class GroupKey(NamedTuple):
    """What makes a series: one line on each plot, one table in the report."""

    study: str
    model: str
    dataset: str
    scaling: str | None
    sync: str
    variant: str = ""  # what tells this series from others of its family (see series.py)


@dataclass(frozen=True)
class Spread:
    """How far a throughput wandered: min-max over ``n`` runs, or over one run's epochs."""

    low: float
    high: float
    n: int
    source: str  # "runs" | "epochs"

    @property
    def range(self) -> tuple[float, float]:
        return (self.low, self.high)


Range = tuple[float, float]


def bounds(formula: Callable[..., float], *ranges: Range | None) -> Range | None:
    """The conservative interval of ``formula`` over input ranges: its lowest and highest value
    at every combination of the ranges' ends (exact for formulas monotonic in each input)."""
    if any(r is None for r in ranges):
        return None
    values = [formula(*corner) for corner in itertools.product(*ranges)]
    return (min(values), max(values))


def within_noise(interval: Range | None, null: float) -> bool:
    """True when the interval includes the no-difference value (e.g. 1 for a ratio)."""
    return interval is not None and interval[0] <= null <= interval[1]


@dataclass(frozen=True)
class Row:
    """One worker count of one group: medians over its repeats, with their spread."""

    key: GroupKey
    workers: int
    runs: int
    mode: str | None  # "weak"/"strong": recorded, or inferred from the batch sizes (see inferred)
    inferred: bool
    per_device_batch: int | None
    global_batch: int | None
    epoch_time_s: float
    epoch_time_min_s: float
    epoch_time_max_s: float
    step_p50_s: float | None
    step_p95_s: float | None
    throughput: float
    throughput_min: float
    throughput_max: float
    reference_workers: int
    reference_throughput: float
    baseline_throughput: float | None
    baseline_step_p50_s: float | None
    test_accuracy: float | None
    peak_memory_bytes: float | None  # the largest rank's peak, median over the runs
    tta_target: float | None
    tta_runs: int  # repeats that had a target
    tta_reached: int  # ... and reached it
    tta_s: float | None
    tta_epoch: float | None
    records: tuple[RunRecord, ...] = field(repr=False, compare=False, default=())
    spread: Spread | None = None  # of this row's throughput
    reference_spread: Spread | None = None  # of the reference row's throughput
    baseline_spread: Spread | None = None  # of the baseline's throughput
    baseline_runs: int = 0
    baselines: tuple[RunRecord, ...] = field(repr=False, compare=False, default=())
    # the task's: throughput's unit, the metric that judges it (the image tasks': accuracy)
    unit: str = "samples"
    units_per_sample: float = 1.0
    judge: str = "accuracy"
    judge_value: float | None = None  # its final test value (validation without one), median
    tta_metric: str = "accuracy"
    tta_higher: bool = True
    # the model's FLOPs per step (torch's counter) and the utilisation of the devices' peak
    flops_per_step: float | None = None
    mfu: float | None = None  # median over the runs
    mfu_measured_peak: bool = False  # a CPU's peak, measured by a matrix multiply
    # the steady step's mean seconds by part (data, compute, sync, optimizer), median over runs
    step_split_s: tuple[float, ...] | None = None
    # memory per device: every rank's peak (median over the runs, rank by rank) and what rank 0
    # held by category (record's memory.split_per_rank; medians): parameters, gradients, ...
    peak_per_rank: tuple[float, ...] = ()
    memory_split: dict[str, float] | None = None

    @property
    def per_device_throughput(self) -> float:
        return self.throughput / self.workers

    @property
    def is_reference(self) -> bool:
        return self.workers == self.reference_workers

    @property
    def speedup(self) -> float | None:
        """X_N / X_1, only against a measured 1-worker run: N_ref·X_N/X_ref would assume that
        N_ref workers scaled perfectly, so without one there is no speedup (see ``ratio``)."""
        if self.reference_workers != 1:
            return None
        return self.ratio

    @property
    def efficiency(self) -> float | None:
        """S_N / N, or without a 1-worker run the relative efficiency N_ref·X_N/(N·X_ref), which
        is 1 at N_ref by definition and so not shown there. Deliberately not capped at 1
        (super-linear scaling is reported as such)."""
        if self.is_reference and self.reference_workers != 1:
            return None
        return self.reference_workers * self.ratio / self.workers

    @property
    def ratio(self) -> float:
        """X_N / X_ref: the throughput relative to the reference row."""
        return self.throughput / self.reference_throughput

    @property
    def ratio_range(self) -> Range | None:
        if self.is_reference:
            return (1.0, 1.0)  # the same runs: no noise between a row and itself
        return bounds(lambda x, r: x / r, range_of(self.spread), range_of(self.reference_spread))

    @property
    def speedup_range(self) -> Range | None:
        return None if self.speedup is None else self.ratio_range

    @property
    def efficiency_range(self) -> Range | None:
        if self.efficiency is None or self.ratio_range is None:
            return None
        k = self.reference_workers / self.workers
        return (k * self.ratio_range[0], k * self.ratio_range[1])

    @property
    def sync_cost(self) -> float | None:
        if self.baseline_throughput is None:
            return None
        return 1.0 - self.throughput / self.baseline_throughput

    @property
    def sync_cost_range(self) -> Range | None:
        if self.baseline_throughput is None:
            return None
        return bounds(lambda s, b: 1.0 - s / b, range_of(self.spread), range_of(self.baseline_spread))

    @property
    def sync_step_delta_s(self) -> float | None:
        if self.baseline_step_p50_s is None or self.step_p50_s is None:
            return None
        return self.step_p50_s - self.baseline_step_p50_s

    def _scale(self) -> float:
        return self.reference_workers / (self.workers * self.reference_throughput)

    @property
    def contention_loss(self) -> float | None:
        """Share of ideal efficiency lost to N processes sharing the machine: 1 - X_b/(N·X_1)."""
        if self.baseline_throughput is None or self.efficiency is None:
            return None
        return 1.0 - self.baseline_throughput * self._scale()

    @property
    def contention_range(self) -> Range | None:
        if self.contention_loss is None:
            return None
        k = self.reference_workers / self.workers
        return bounds(lambda b, r: 1.0 - k * b / r, range_of(self.baseline_spread),
                      range_of(self.reference_spread))

    @property
    def exchange_loss(self) -> float | None:
        """Share of ideal efficiency lost to gradient exchange: (X_b - X_s)/(N·X_1)."""
        if self.baseline_throughput is None or self.efficiency is None:
            return None
        return (self.baseline_throughput - self.throughput) * self._scale()

    @property
    def exchange_range(self) -> Range | None:
        if self.exchange_loss is None:
            return None
        k = self.reference_workers / self.workers
        return bounds(lambda b, s, r: k * (b - s) / r, range_of(self.baseline_spread),
                      range_of(self.spread), range_of(self.reference_spread))

    @property
    def busy(self) -> tuple[RunRecord, ...]:
        """This row's runs and baselines that ran on a busy machine (``machine.busy``)."""
        return tuple(r for r in (*self.records, *self.baselines) if is_busy(r))

    @property
    def formula(self) -> str:
        return FORMULAS.get(self.mode, FORMULAS[None])


def range_of(spread: Spread | None) -> Range | None:
    return None if spread is None else spread.range


def is_busy(record: RunRecord) -> bool:
    """Whether the run's record says other programs used the CPUs meanwhile (older records and
    failed ones have no machine block: not busy, as far as anyone can tell)."""
    return record.get("machine", "busy") is True


def steady_epoch_throughputs(record: RunRecord) -> list[float]:
    """The run's steady epochs' throughputs: warm-up, partial and profiled epochs left out, and
    none when the only epoch stood in for the steady figures (``summary.warmup_included``)."""
    if record.get("summary", "warmup_included"):
        return []
    epochs = record.get("epochs", default=[])
    found = []
    for epoch in epochs if isinstance(epochs, list) else []:
        if isinstance(epoch, dict) and not any(epoch.get(k) for k in ("warmup", "partial",
                                                                        "profiled")):
            value = epoch.get("throughput")
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value) and value > 0:
                found.append(float(value))
    return found


def throughput_spread(runs: list[RunRecord]) -> Spread | None:
    """Min-max over the runs when there are repeats, else over the one run's steady epochs."""
    x = [v for v in (_num(r, "summary", "steady_throughput") for r in runs) if v is not None]
    if len(x) > 1:
        return Spread(min(x), max(x), len(x), "runs")
    if len(runs) == 1:
        epochs = steady_epoch_throughputs(runs[0])
        if len(epochs) > 1:
            return Spread(min(epochs), max(epochs), len(epochs), "epochs")
    return None


def summary_rows(records: Iterable[RunRecord]) -> list[Row]:
    """Scaling rows from the ``ok`` records: pure, so tables and plots agree by construction."""
    ok = [r for r in records if r.status == "ok"]
    labels = variants(ok)
    groups: dict[GroupKey, dict[int, list[RunRecord]]] = defaultdict(lambda: defaultdict(list))
    baselines: dict[tuple, list[RunRecord]] = defaultdict(list)
    order: dict[str, int] = {}
    for record in ok:
        order.setdefault(record.study, len(order))
        if record.baseline:
            # matched without sync: a baseline exchanges nothing, whatever its sync setting says
            where = (record.study, record.model, record.dataset, record.scaling,
                     labels[id(record)], record.workers)
            baselines[where].append(record)
        else:
            groups[key_of(record, labels[id(record)])][record.workers].append(record)
    rows: list[Row] = []
    for key in sorted(groups, key=lambda k: (order[k.study], k.model, k.dataset, k.scaling or "",
                                             k.sync, k.variant)):
        by_n = groups[key]
        ref_n = 1 if 1 in by_n else min(by_n)
        ref_x = median(_num(r, "summary", "steady_throughput") for r in by_n[ref_n])
        ref_spread = throughput_spread(by_n[ref_n])
        mode, inferred = (key.scaling, False) if key.scaling else (_infer_mode(by_n), True)
        for n in sorted(by_n):
            base = baselines.get((key.study, key.model, key.dataset, key.scaling, key.variant, n),
                                 [])
            rows.append(_row(key, n, by_n[n], ref_n, ref_x, mode, inferred and mode is not None,
                             base, ref_spread))
    return rows


def key_of(record: RunRecord, variant: str = "") -> GroupKey:
    return GroupKey(record.study, record.model, record.dataset, record.scaling, record.sync, variant)


def _row(key: GroupKey, n: int, runs: list[RunRecord], ref_n: int, ref_x: float,
         mode: str | None, inferred: bool, base: list[RunRecord],
         ref_spread: Spread | None = None) -> Row:
    x = [_num(r, "summary", "steady_throughput") for r in runs]
    t = [_num(r, "summary", "steady_epoch_time_s") for r in runs]
    tta = [r.get("time_to_accuracy") for r in runs if isinstance(r.get("time_to_accuracy"), dict)]
    reached = [d for d in tta if d.get("reached")]
    first = runs[0]
    per = first.task_fact("units_per_sample", (int, float), 1.0)
    judge = first.task_fact("judge", str, "accuracy")
    return Row(
        key=key, workers=n, runs=len(runs), mode=mode, inferred=inferred,
        per_device_batch=runs[0].get("derived", "per_device_batch"),
        global_batch=runs[0].get("derived", "global_batch"),
        epoch_time_s=median(t), epoch_time_min_s=min(t), epoch_time_max_s=max(t),
        step_p50_s=_median(_num(r, "steps", "phases", "step", "p50") for r in runs),
        step_p95_s=_median(_num(r, "steps", "phases", "step", "p95") for r in runs),
        throughput=median(x), throughput_min=min(x), throughput_max=max(x),
        reference_workers=ref_n, reference_throughput=ref_x,
        baseline_throughput=_median(_num(r, "summary", "steady_throughput") for r in base),
        baseline_step_p50_s=_median(_num(r, "steps", "phases", "step", "p50") for r in base),
        test_accuracy=_median(_num(r, "summary", "final_test_accuracy") for r in runs),
        peak_memory_bytes=_median(_peak(r) for r in runs),
        tta_target=tta[0].get("target") if tta else None,
        tta_runs=len(tta), tta_reached=len(reached),
        tta_s=_median(d.get("elapsed_s") for d in reached),
        tta_epoch=_median(d.get("epoch") for d in reached),
        records=tuple(runs),
        spread=throughput_spread(runs), reference_spread=ref_spread,
        baseline_spread=throughput_spread(base) if base else None, baseline_runs=len(base),
        baselines=tuple(base),
        unit=first.task_fact("unit", str, "samples"),
        units_per_sample=float(per) if per > 0 else 1.0, judge=judge,
        judge_value=_median(_final(r, judge) for r in runs),
        tta_metric=str(tta[0].get("metric", "accuracy")) if tta else "accuracy",
        tta_higher=tta[0].get("higher_is_better", True) is not False if tta else True,
        flops_per_step=_median(_num(r, "summary", "flops_per_step") for r in runs),
        mfu=_median(_num(r, "summary", "mfu") for r in runs),
        mfu_measured_peak=runs[0].get("flops", "peak_measured") is True,
        step_split_s=_split(runs),
        peak_per_rank=_peaks_by_rank(runs), memory_split=_memory_split(runs),
    )


STEP_PARTS = ("data", "compute", "sync", "optimizer")


def _split(runs: list[RunRecord]) -> tuple[float, ...] | None:
    """Where the steady step's time went, by part: each part's mean over every rank's steps,
    median over the runs; None when a record lacks a part (older records timed the step only)."""
    parts = [_median(_num(r, "steps", "phases", part, "mean") for r in runs)
             for part in STEP_PARTS]
    return None if any(p is None for p in parts) else tuple(parts)  # type: ignore[arg-type]


def _final(record: RunRecord, metric: str) -> float | None:
    """The run's last evaluated value of ``metric``: on the test set, else on validation."""
    for split in ("test", "val"):
        value = _num(record, "summary", "final_metrics", f"{split}_{metric}")
        if value is not None:
            return value
    return _num(record, "summary", "final_test_accuracy") if metric == "accuracy" else None


def _peak(record: RunRecord) -> float | None:
    """The run's largest per-rank peak memory (resident set on a CPU, allocated on a GPU)."""
    peaks = [p for p in record.get("memory", "peak_bytes_per_rank", default=[])
             if isinstance(p, (int, float)) and not isinstance(p, bool) and p > 0]
    return float(max(peaks)) if peaks else None


#: the categories of a record's memory.split_per_rank, in the order plots stack them
SPLIT = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")


def _peaks_by_rank(runs: list[RunRecord]) -> tuple[float, ...]:
    """Each rank's peak, the median over the runs that recorded every rank's."""
    lists = [r.get("memory", "peak_bytes_per_rank", default=[]) for r in runs]
    lists = [p for p in lists if isinstance(p, list) and p
             and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                     for v in p)]
    if not lists:
        return ()
    width = min(len(p) for p in lists)
    return tuple(float(median(p[i] for p in lists)) for i in range(width))


def _memory_split(runs: list[RunRecord]) -> dict[str, float] | None:
    """Rank 0's memory split by category (medians over the runs that have one), or None."""
    found = []
    for r in runs:
        split = r.get("memory", "split_per_rank", default=None)
        first = split[0] if isinstance(split, list) and split else None
        if isinstance(first, dict):  # activations are None where they were not counted
            first = {**first, SPLIT[-1]: first.get(SPLIT[-1]) or 0}
            if all(isinstance(first.get(k), (int, float)) and not isinstance(first.get(k), bool)
                   and first[k] >= 0 for k in SPLIT):
                found.append(first)
    if not found:
        return None
    return {k: float(median(s[k] for s in found)) for k in SPLIT}


def _infer_mode(by_n: dict[int, list[RunRecord]]) -> str | None:
    """Plain train runs carry no scaling mode: fixed per-device batch means weak, fixed global strong."""
    if len(by_n) < 2:
        return None
    records = [r for rs in by_n.values() for r in rs]
    if len({r.get("derived", "per_device_batch") for r in records}) == 1:
        return "weak"
    if len({r.get("derived", "global_batch") for r in records}) == 1:
        return "strong"
    return None


def _num(record: RunRecord, *keys: str) -> float | None:
    value = record.get(*keys)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _median(values: Iterable[Any]) -> float | None:
    present = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return median(present) if present else None



def grouped(rows: list[Row]) -> dict[GroupKey, list[Row]]:
    """Rows by group, in table order."""
    out: dict[GroupKey, list[Row]] = {}
    for row in rows:
        out.setdefault(row.key, []).append(row)
    return out

