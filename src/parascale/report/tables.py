"""Summary rows computed from run records, and their terminal, CSV and Markdown forms.

Definitions (also printed with every table):

- X_N: global steady throughput, ``summary.steady_throughput`` (samples/s over the slowest rank,
  warm-up epoch excluded). Per-device throughput is X_N / N.
- Reference: the 1-worker row of a group if it has one, else its smallest N (N_ref), and then the
  table says "relative to N_ref workers". The reference row itself then shows no speedup: its
  own would only restate the assumption that N_ref workers scaled perfectly, so it is never
  printed as a measurement, and a group with one worker count has no speedup at all.
- Speedup S_N = N_ref * X_N / X_ref (= X_N / X_1 when N_ref = 1). Efficiency E_N = S_N / N.
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

import csv
import io
import itertools
import math
import re
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from parascale.report.load import Problem, RunRecord
from parascale.report.series import variants

FORMULAS = {
    "weak": "E = t1/tN (t = time per step, per-device batch fixed)",
    "strong": "E = t1/(N·tN) (t = time per step, global batch fixed)",
    None: "E = X_N/(N·X_1) (X = global throughput in samples/s; scaling mode not recorded)",
}
SPEEDUP = "S = N_ref·X_N/X_ref, E = S/N"
SPREAD_NOTE = ("(a–b): min–max over the runs, or over one run's steady epochs (\"ep\"); speedup, "
               "efficiency and costs: the formula at the extremes of those ranges; "
               "~ within noise (the range includes no change)")
OUTSIDE = ("Not in this study's plan (runs of an earlier plan in the same folder, kept apart "
           "and left out of the tables)")
WIDTH = 120  # terminal tables fit this many columns; wider ones wrap into panels


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

    @property
    def per_device_throughput(self) -> float:
        return self.throughput / self.workers

    @property
    def is_reference(self) -> bool:
        return self.workers == self.reference_workers

    @property
    def speedup(self) -> float | None:
        """N_ref·X_N/X_ref; None for a reference row other than 1 worker, whose speedup would only
        restate the assumption that N_ref workers scaled perfectly (never invented)."""
        if self.is_reference and self.reference_workers != 1:
            return None
        return self.reference_workers * self.throughput / self.reference_throughput

    @property
    def efficiency(self) -> float | None:
        """S_N / N; deliberately not capped at 1 (super-linear scaling is reported as such)."""
        return None if self.speedup is None else self.speedup / self.workers

    @property
    def ratio(self) -> float:
        """X_N / X_ref: the throughput relative to the reference row."""
        return self.throughput / self.reference_throughput

    @property
    def ratio_range(self) -> Range | None:
        if self.is_reference:
            return (1.0, 1.0)  # the same runs: no noise between a row and itself
        return bounds(lambda x, r: x / r, _range(self.spread), _range(self.reference_spread))

    @property
    def speedup_range(self) -> Range | None:
        if self.speedup is None or self.ratio_range is None:
            return None
        return tuple(self.reference_workers * v for v in self.ratio_range)  # type: ignore

    @property
    def efficiency_range(self) -> Range | None:
        s = self.speedup_range
        return None if s is None else (s[0] / self.workers, s[1] / self.workers)

    @property
    def sync_cost(self) -> float | None:
        if self.baseline_throughput is None:
            return None
        return 1.0 - self.throughput / self.baseline_throughput

    @property
    def sync_cost_range(self) -> Range | None:
        if self.baseline_throughput is None:
            return None
        return bounds(lambda s, b: 1.0 - s / b, _range(self.spread), _range(self.baseline_spread))

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
        if self.baseline_throughput is None or self.speedup is None:
            return None
        return 1.0 - self.baseline_throughput * self._scale()

    @property
    def contention_range(self) -> Range | None:
        if self.contention_loss is None:
            return None
        k = self.reference_workers / self.workers
        return bounds(lambda b, r: 1.0 - k * b / r, _range(self.baseline_spread),
                      _range(self.reference_spread))

    @property
    def exchange_loss(self) -> float | None:
        """Share of ideal efficiency lost to gradient exchange: (X_b - X_s)/(N·X_1)."""
        if self.baseline_throughput is None or self.speedup is None:
            return None
        return (self.baseline_throughput - self.throughput) * self._scale()

    @property
    def exchange_range(self) -> Range | None:
        if self.exchange_loss is None:
            return None
        k = self.reference_workers / self.workers
        return bounds(lambda b, s, r: k * (b - s) / r, _range(self.baseline_spread),
                      _range(self.spread), _range(self.reference_spread))

    @property
    def busy(self) -> tuple[RunRecord, ...]:
        """This row's runs and baselines that ran on a busy machine (``machine.busy``)."""
        return tuple(r for r in (*self.records, *self.baselines) if is_busy(r))

    @property
    def formula(self) -> str:
        return FORMULAS.get(self.mode, FORMULAS[None])


def _range(spread: Spread | None) -> Range | None:
    return None if spread is None else spread.range


def is_busy(record: RunRecord) -> bool:
    """Whether the run's record says other programs used the CPUs meanwhile (older records and
    failed ones have no machine block: not busy, as far as anyone can tell)."""
    return record.get("machine", "busy") is True


def steady_epoch_throughputs(record: RunRecord) -> list[float]:
    """The run's steady epochs' throughputs: warm-up and partial epochs left out, and none when
    the only epoch stood in for the steady figures (``summary.warmup_included``)."""
    if record.get("summary", "warmup_included"):
        return []
    epochs = record.get("epochs", default=[])
    found = []
    for epoch in epochs if isinstance(epochs, list) else []:
        if isinstance(epoch, dict) and not epoch.get("warmup") and not epoch.get("partial"):
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
            groups[_key(record, labels[id(record)])][record.workers].append(record)
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


def _key(record: RunRecord, variant: str = "") -> GroupKey:
    return GroupKey(record.study, record.model, record.dataset, record.scaling, record.sync, variant)


def _row(key: GroupKey, n: int, runs: list[RunRecord], ref_n: int, ref_x: float,
         mode: str | None, inferred: bool, base: list[RunRecord],
         ref_spread: Spread | None = None) -> Row:
    x = [_num(r, "summary", "steady_throughput") for r in runs]
    t = [_num(r, "summary", "steady_epoch_time_s") for r in runs]
    tta = [r.get("time_to_accuracy") for r in runs if isinstance(r.get("time_to_accuracy"), dict)]
    reached = [d for d in tta if d.get("reached")]
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
        tta_target=tta[0].get("target") if tta else None,
        tta_runs=len(tta), tta_reached=len(reached),
        tta_s=_median(d.get("elapsed_s") for d in reached),
        tta_epoch=_median(d.get("epoch") for d in reached),
        records=tuple(runs),
        spread=throughput_spread(runs), reference_spread=ref_spread,
        baseline_spread=throughput_spread(base) if base else None, baseline_runs=len(base),
        baselines=tuple(base),
    )


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


# ---- grouping and wording shared by every output ----------------------------------------------

def grouped(rows: list[Row]) -> dict[GroupKey, list[Row]]:
    """Rows by group, in table order."""
    out: dict[GroupKey, list[Row]] = {}
    for row in rows:
        out.setdefault(row.key, []).append(row)
    return out


def group_title(key: GroupKey, rows: list[Row], all_keys: Iterable[GroupKey]) -> str:
    """'smallcnn on digits, weak scaling' plus sync/study only when they tell series apart."""
    keys = list(all_keys)
    mode = rows[0].mode if rows else key.scaling
    title = f"{key.model} on {key.dataset}, "
    if mode is None:
        title += "scaling mode not recorded"
    else:
        title += f"{mode} scaling" + (" (inferred from batch sizes)" if rows and rows[0].inferred else "")
    if len({k.sync for k in keys}) > 1 or key.sync != "allreduce":
        title += f", sync {key.sync}"
    if key.variant:
        title += f", {key.variant}"
    if len({k.study for k in keys}) > 1:
        title += f" [{key.study}]"
    return title


def reference_note(rows: list[Row]) -> str:
    """Formula and reference: printed under every table so nobody has to guess."""
    ref = rows[0].reference_workers
    if len(rows) == 1 and ref != 1:
        return (f"one worker count only and no 1-worker run: no speedup or efficiency can be "
                f"measured (add --workers 1,{ref}, or --scaling weak|strong for a study)")
    note = f"{rows[0].formula}; speedup {SPEEDUP}"
    if ref != 1:
        note += (f"; no 1-worker run, so relative to {ref} workers (their own speedup is not "
                 "measured: 'ref')")
    return note + "; " + SPREAD_NOTE


def sentences(rows: list[Row], unfinished: Iterable[RunRecord] = ()) -> list[str]:
    """One plain sentence per group saying how well it scaled, with a note when notable.

    Groups in which nothing finished get a sentence too, so a study of failures still says so.
    A warning about runs on a busy machine comes first.
    """
    groups = grouped(rows)
    # an unfinished run has no measured settings to place it in a series: it joins the first
    # series of its family
    first = {}
    for key in groups:
        first.setdefault(key._replace(variant=""), key)
    missing: dict[GroupKey, list[RunRecord]] = defaultdict(list)
    for record in unfinished:
        if not record.baseline:
            key = _key(record)
            missing[first.get(key, key)].append(record)
    keys = list(groups) + [k for k in missing if k not in groups]
    out = []
    warning = busy_sentence(rows)
    if warning:
        out.append(warning)
    for key in keys:
        group = groups.get(key, [])
        text = group_title(key, group, keys) + ": " + (_how_it_scaled(group) if group else
                                                        "no configuration finished.")
        if missing.get(key):
            text += " Not finished: " + ", ".join(
                f"N={r.workers if r.workers else '?'} ({r.status})"
                for r in sorted(missing[key], key=lambda r: r.workers or 0)) + "."
        out.append(text)
    return out


def _span(interval: Range | None, fmt: Callable[[float], str]) -> str:
    """'1.30–1.60' for an interval of non-zero width, '' otherwise."""
    if interval is None or interval[0] == interval[1]:
        return ""
    # '-21–65' reads as a subtraction: a range crossing zero is written out
    joint = " to " if interval[0] < 0 else "–"
    return f"{fmt(interval[0])}{joint}{fmt(interval[1])}"


def _how_it_scaled(group: list[Row]) -> str:
    ref = next(r for r in group if r.workers == r.reference_workers)
    top = group[-1]
    if len(group) == 1:
        text = (f"only {_plural(top.workers, 'worker')} measured ({top.throughput:,.0f} "
                "samples/s), so there is nothing to compare against")
        if top.workers != 1:
            text += (f": a speedup needs a 1-worker run (--workers 1,{top.workers}, or "
                     "--scaling weak|strong for a whole study)")
        return text + "."
    rel = f" relative to {ref.workers} workers" if ref.workers != 1 else ""
    than = f"{ref.workers}" if ref.workers == 1 else f"{ref.workers} workers"
    ratio, interval = top.ratio, top.ratio_range
    span = _span(interval, lambda v: f"{v:.2f}")
    eff = f"efficiency {top.efficiency:.0%}{rel}"
    if interval is None:
        text = (f"{_plural(top.workers, 'worker')} reach {ratio:.2f}× the throughput of {than} "
                f"({eff}), but with one run of one steady epoch per configuration the spread is "
                "unknown, so this may be noise.")
    elif within_noise(interval, 1.0):
        text = (f"{_plural(top.workers, 'worker')} reach {ratio:.2f}× the throughput of {than}, "
                f"within noise (spread {span}×{_over(top, ref)}): no speedup or slowdown is "
                "measurable here.")
    elif interval[1] < 1:
        text = (f"{_plural(top.workers, 'worker')} are slower than {than}: {ratio:.2f}× its "
                f"throughput ({'spread ' + span + '×' + _over(top, ref) + ', ' if span else ''}"
                f"{eff}).")
    else:
        text = (f"{_plural(top.workers, 'worker')} reach {ratio:.2f}× the throughput of {than} "
                f"({'spread ' + span + '×' + _over(top, ref) + ', ' if span else ''}{eff}).")
    e_range = top.efficiency_range or (top.efficiency, top.efficiency)
    if round(top.efficiency, 2) > 1 and e_range[0] > 1:  # only when the printed figure says so too
        text += (" Super-linear (above 100%): each worker did more than one alone, "
                 "usually because its share of the data fits a cache; worth a second look.")
    elif e_range[1] < 0.5:
        text += (" Below 50%: more than half of every added worker is lost, typically to "
                 "communication or to contention for shared cores and memory.")
    text += _lost_split(top)
    text += _sync_sentence(top)
    return text


def _over(row: Row, ref: Row) -> str:
    """What n the spread rests on: ' over 3 runs each' or ' over steady epochs'."""
    sources = {s.source for s in (row.spread, ref.spread) if s is not None}
    if sources == {"runs"}:
        return f" over {row.runs} runs each" if row.runs == ref.runs else \
            f" over {ref.runs} and {row.runs} runs"
    if sources == {"epochs"}:
        return ", one run each: its steady epochs"
    return ", from repeats and steady epochs"


def _points(value: float) -> str:
    return f"{100 * value:.0f}"


def _lost_split(row: Row) -> str:
    """'Of the 28% lost at N=2, 20 points is 2 processes sharing the machine, 8 points is
    gradient exchange.' Parts inside the noise say so; nothing when nothing was lost."""
    if row.contention_loss is None or row.efficiency is None:
        return ""
    lost = 1.0 - row.efficiency
    if lost <= 0 or within_noise(row.efficiency_range, 1.0):
        return ""
    parts = []
    for value, interval, what in (
            (row.contention_loss, row.contention_range,
             f"{row.workers} processes sharing the machine"),
            (row.exchange_loss, row.exchange_range, "gradient exchange")):
        span = _span(interval, _points)
        if within_noise(interval, 0.0):
            parts.append(f"{_points(value)} points is {what} (within noise: {span})"
                         if value >= 0 else f"{what}: not measurable here (within noise: {span})")
        else:
            parts.append(f"{_points(value)} points is {what}" + (f" ({span})" if span else ""))
    return f" Of the {lost:.0%} lost at N={row.workers}, " + ", ".join(parts) + "."


def _sync_sentence(row: Row) -> str:
    cost = row.sync_cost
    if cost is None:
        return ""
    interval = row.sync_cost_range
    span = _span(interval, lambda v: f"{v:.0%}")
    if within_noise(interval, 0.0):
        return (f" The cost of gradient exchange is not measurable here at N={row.workers}: "
                f"{cost:+.0%} of throughput, within noise (spread {span}).")
    if cost < 0:
        return (f" The cost of gradient exchange is not measurable here at N={row.workers}: the "
                f"synchronised runs were {-cost:.0%} faster than the baseline"
                + (", beyond the spread," if interval else ", spread unknown;")
                + " which exchanging gradients cannot cause (the machine's load probably "
                "changed between runs).")
    text = f" Gradient exchange costs {cost:.0%} of throughput at N={row.workers}"
    if interval is None:
        return text + " (spread unknown)."
    return text + (f" (spread {span})." if span else ".")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---- contention -------------------------------------------------------------------------------

def busy_records(rows: list[Row]) -> list[RunRecord]:
    """Every run behind the rows (baselines too) that ran on a busy machine, in table order."""
    return [r for row in rows for r in row.busy]


def _machine_text(record: RunRecord) -> str:
    other = record.get("machine", "other_cores", default=0.0)
    steal = record.get("machine", "steal_cores", default=0.0)
    cores = record.get("machine", "cores")
    text = f"{other:.2f} other cores" + (f" + {steal:.2f} stolen" if steal else "")
    if cores:
        text += f" of {cores}"
    top = _biggest_other(record)
    if top is not None:
        text += (f"; biggest other: {str(top.get('command', '?'))[:60]} (pid {top.get('pid')}, "
                 f"{top.get('cores', 0):.2f} cores)")
    return text


def _biggest_other(record: RunRecord) -> dict | None:
    found = [p for h in record.get("machine", "hosts", default=[]) if isinstance(h, dict)
             for p in h.get("top_others") or [] if isinstance(p, dict)]
    return max(found, key=lambda p: p.get("cores") or 0) if found else None


def busy_lines(rows: list[Row]) -> list[str]:
    """One line per run that ran on a busy machine: which run, how much other load, and the
    biggest other process."""
    return [f"{r.describe()}: {_machine_text(r)}" for r in busy_records(rows)]


def busy_sentence(rows: list[Row]) -> str:
    busy = busy_records(rows)
    if not busy:
        return ""
    total = sum(len(row.records) + len(row.baselines) for row in rows)
    worst = max(busy, key=lambda r: r.get("machine", "other_cores", default=0.0))
    top = _biggest_other(worst)
    text = (f"Warning: {len(busy)} of {total} runs ran on a busy machine (other programs used "
            f"up to {worst.get('machine', 'other_cores', default=0.0):.2f} cores meanwhile")
    if top is not None:
        text += f"; the biggest: {str(top.get('command', '?'))[:60]}"
    return text + ("), so their throughput may be understated and the comparisons skewed; "
                   "parascale bench --quiet-machine waits for a quiet machine before each run.")


# ---- cells ------------------------------------------------------------------------------------

def _noise(text: str, interval: Range | None, null: float) -> str:
    return text + ("~" if within_noise(interval, null) and interval[0] != interval[1] else "")


def _with_span(text: str, interval: Range | None, fmt: Callable[[float], str]) -> str:
    span = _span(interval, fmt)
    return text + (f" ({span})" if span else "")


def _runs_cell(row: Row) -> str:
    spread = row.spread
    return str(row.runs) + (f" ({spread.n} ep)" if spread and spread.source == "epochs" else "")


def _throughput_cell(value: float, spread: Spread | None, runs: int) -> str:
    text = f"{value:,.0f}"
    if spread is not None and (runs > 1 or spread.low != spread.high):
        text += f" ({spread.low:,.0f}–{spread.high:,.0f})"
    return text


def _speedup_cell(row: Row) -> str:
    if row.speedup is None:
        return "ref"
    return _noise(_with_span(f"{row.speedup:.2f}×", row.speedup_range, lambda v: f"{v:.2f}"),
                  row.speedup_range, row.reference_workers)


def _efficiency_cell(row: Row) -> str:
    if row.efficiency is None:
        return "ref"
    return _noise(_with_span(f"{row.efficiency:.1%}", row.efficiency_range,
                             lambda v: f"{100 * v:.1f}"), row.efficiency_range, 1.0)


def loss_text(value: float | None, interval: Range | None) -> str:
    if value is None:
        return "—"
    return _noise(_with_span(f"{_points(value)} pts", interval, _points), interval, 0.0)


def _sync_cell(row: Row) -> str:
    if row.sync_cost is None:
        return "—"
    interval = row.sync_cost_range
    span = _span(interval, lambda v: f"{100 * v:.1f}")
    delta = row.sync_step_delta_s
    ms = f"{delta * 1000:+.1f} ms/step" if delta is not None else ""
    inner = "; ".join(p for p in (span, ms) if p)
    return _noise(f"{row.sync_cost:.1%}" + (f" ({inner})" if inner else ""), interval, 0.0)


def _target_header(rows: list[Row]) -> str:
    targets = {r.tta_target for r in rows if r.tta_target is not None}
    return f"time to {next(iter(targets)):.0%}" if len(targets) == 1 else "time to acc"


# (header, cell, shown when) for every column; columns with nothing to show for a group are left
# out of its table, so that a study without baselines or targets gets a narrower table.
COLUMNS: list[tuple[str, Callable[[Row], str], Callable[[Row], bool]]] = [
    ("workers", lambda r: str(r.workers), lambda r: True),
    ("runs", _runs_cell, lambda r: True),
    ("epoch (s)", lambda r: _sig(r.epoch_time_s) + (
        f" ({_sig(r.epoch_time_min_s)}–{_sig(r.epoch_time_max_s)})" if r.runs > 1 else ""),
     lambda r: True),
    ("step p50 (ms)", lambda r: _ms(r.step_p50_s), lambda r: r.step_p50_s is not None),
    ("step p95 (ms)", lambda r: _ms(r.step_p95_s), lambda r: r.step_p95_s is not None),
    ("samples/s", lambda r: _throughput_cell(r.throughput, r.spread, r.runs), lambda r: True),
    ("per device", lambda r: f"{r.per_device_throughput:,.0f}", lambda r: True),
    ("baseline samples/s", lambda r: "—" if r.baseline_throughput is None else
     _throughput_cell(r.baseline_throughput, r.baseline_spread, r.baseline_runs),
     lambda r: r.baseline_throughput is not None),
    ("speedup", _speedup_cell, lambda r: True),
    ("efficiency", _efficiency_cell, lambda r: True),
    ("lost: sharing", lambda r: loss_text(r.contention_loss, r.contention_range),
     lambda r: r.contention_loss is not None),
    ("lost: exchange", lambda r: loss_text(r.exchange_loss, r.exchange_range),
     lambda r: r.exchange_loss is not None),
    ("sync cost", _sync_cell, lambda r: r.sync_cost is not None),
    ("test acc", lambda r: "—" if r.test_accuracy is None else f"{r.test_accuracy:.1%}",
     lambda r: True),
    ("time to acc", lambda r: _tta(r), lambda r: r.tta_runs > 0),
]
HEADERS = [header for header, _, _ in COLUMNS]


def table(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of one group's table, without the columns it has nothing for."""
    alone = len(rows) == 1  # nothing to compare with: a speedup of 1.00x would say nothing
    shown = [(h, cell) for h, cell, when in COLUMNS if any(when(r) for r in rows)
             and not (alone and h in ("speedup", "efficiency"))]
    headers = [_target_header(rows) if h == "time to acc" else h for h, _ in shown]
    return headers, [[cell(r) for _, cell in shown] for r in rows]


def cells(row: Row) -> list[str]:
    """A row as display strings, every column (see :data:`HEADERS`)."""
    return [cell(row) for _, cell, _ in COLUMNS]


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else _sig(seconds * 1000)


def _sig(value: float) -> str:
    """Three significant digits, keeping trailing zeros (1.30, not 1.3) but no '123.' or 1e+03."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:#.3g}"


def _tta(row: Row) -> str:
    if row.tta_runs == 0:
        return "—"
    if row.tta_reached == 0:
        return "not reached"
    text = f"{_sig(row.tta_s)} s (epoch {row.tta_epoch:g})"
    if row.tta_reached < row.tta_runs:
        text += f", {row.tta_reached}/{row.tta_runs} runs"
    return text


# ---- the three text forms -----------------------------------------------------------------------

def panels(headers: list[str], body: list[list[str]], width: int = WIDTH,
           indent: str = "  ") -> list[str]:
    """Right-aligned columns in lines of at most ``width`` characters: columns that do not fit
    go on into another panel below, which repeats the first column (the worker count)."""
    widths = [max(len(line[i]) for line in [headers, *body]) for i in range(len(headers))]
    chunks: list[list[int]] = [[0]]
    used = len(indent) + widths[0]
    for i in range(1, len(headers)):
        if used + 2 + widths[i] > width and len(chunks[-1]) > 1:
            chunks.append([0])
            used = len(indent) + widths[0]
        chunks[-1].append(i)
        used += 2 + widths[i]
    lines: list[str] = []
    for number, chunk in enumerate(chunks):
        if number:
            lines.append("")
        for line in [headers, *body]:
            lines.append(indent + "  ".join(line[i].rjust(widths[i]) for i in chunk))
    return lines


def wrap(text: str, width: int = WIDTH, indent: str = "") -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_on_hyphens=False) or [indent]


def format_terminal(rows: list[Row], unfinished: Iterable[RunRecord] = (),
                    problems: Iterable[Problem] = (), outside: Iterable[str] = ()) -> str:
    """Plain-text tables, one per group, at most 120 columns wide; then runs on a busy machine,
    everything that did not finish, and the runs of the folder that are not in its plan."""
    groups = grouped(rows)
    blocks = []
    for key, group in groups.items():
        headers, body = table(group)
        blocks.append("\n".join(wrap(group_title(key, group, groups))
                                + wrap(reference_note(group), indent="  ")
                                + panels(headers, body)))
    busy = busy_lines(rows)
    if busy:
        blocks.append("\n".join(wrap(busy_sentence(rows))
                                + [ln for line in busy for ln in wrap(line, indent="  ")]))
    lost = issue_lines(unfinished, problems)
    if lost:
        # not wrapped: each line ends in a path, which a reader copies whole
        blocks.append("Not finished or unreadable:\n" + "\n".join("  " + line for line in lost))
    outside = list(outside)
    if outside:
        blocks.append(OUTSIDE + ":\n" + "\n".join("  " + line for line in outside))
    if not blocks:
        return "No finished runs."
    return _plain("\n\n".join(blocks))


def issue_lines(unfinished: Iterable[RunRecord], problems: Iterable[Problem]) -> list[str]:
    """Every run that contributed no numbers, with its reason: never silently dropped."""
    lines = [f"{r.describe()}: {r.status}: {r.reason} ({r.path})" for r in unfinished]
    lines += [f"{p.path}: {p.reason}" for p in problems]
    return lines


def format_markdown(rows: list[Row], unfinished: Iterable[RunRecord] = (),
                    problems: Iterable[Problem] = (), outside: Iterable[str] = ()) -> str:
    """GitHub-flavoured Markdown: a heading, a note and a table per group."""
    groups = grouped(rows)
    out = ["# Scaling summary", ""]
    for key, group in groups.items():
        headers, body = table(group)
        out += [f"## {_md(group_title(key, group, groups))}", "", _md(reference_note(group)), ""]
        out.append("| " + " | ".join(headers) + " |")
        out.append("|" + "|".join("---:" for _ in headers) + "|")
        out += ["| " + " | ".join(_md(c) for c in line) + " |" for line in body]
        out.append("")
    if not groups:
        out += ["No finished runs.", ""]
    busy = busy_lines(rows)
    if busy:
        out += ["## Runs on a busy machine", ""] + [f"- {_md(line)}" for line in busy] + [""]
    lost = issue_lines(unfinished, problems)
    if lost:
        out += ["## Not finished or unreadable", ""] + [f"- {_md(line)}" for line in lost] + [""]
    outside = list(outside)
    if outside:
        out += [f"## {OUTSIDE}", ""] + [f"- {_md(line)}" for line in outside] + [""]
    out += ["Sentences:", ""] + [f"- {_md(s)}" for s in sentences(rows, unfinished)] + [""]
    return "\n".join(out)


def _md(text: str) -> str:
    """Keep user text (model names, reasons) from breaking the table or turning into markup."""
    for char in "\\|*`<>[]":  # not _: GFM ignores it inside words, and N_ref should stay legible
        text = text.replace(char, "\\" + char)
    return _plain(text.replace("\n", " "))


# Control characters other than tab and newline, and the bidirectional overrides: text from a
# record must not be able to send escape sequences to a terminal or reorder what it shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _plain(text: str) -> str:
    """``text`` with control characters written as escapes (\\x1b), for terminals and files."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


CSV_COLUMNS = [
    "study", "model", "dataset", "scaling", "scaling_inferred", "sync", "workers", "runs", "status",
    "reason", "per_device_batch", "global_batch", "steady_epoch_time_s", "epoch_time_min_s",
    "epoch_time_max_s", "step_p50_s", "step_p95_s", "throughput_samples_per_s", "throughput_min",
    "throughput_max", "per_device_throughput", "reference_workers", "speedup", "efficiency",
    "efficiency_formula", "baseline_throughput", "sync_cost", "sync_step_delta_s", "test_accuracy",
    "tta_target", "tta_reached_runs", "time_to_accuracy_s", "time_to_accuracy_epoch", "source",
]
# the spread and the intervals (see the module docstring), and the lost-efficiency split
CSV_COLUMNS += [
    "spread_source", "spread_n", "throughput_low", "throughput_high", "speedup_low",
    "speedup_high", "efficiency_low", "efficiency_high", "baseline_throughput_low",
    "baseline_throughput_high", "sync_cost_low", "sync_cost_high", "contention_loss",
    "contention_loss_low", "contention_loss_high", "exchange_loss", "exchange_loss_low",
    "exchange_loss_high", "busy_runs",
]


def _interval_columns(r: Row) -> dict[str, Any]:
    def ends(prefix: str, interval: Range | None) -> dict[str, Any]:
        return {f"{prefix}_low": interval[0] if interval else None,
                f"{prefix}_high": interval[1] if interval else None}

    return {"spread_source": r.spread.source if r.spread else "",
            "spread_n": r.spread.n if r.spread else "",
            **ends("throughput", _range(r.spread)), **ends("speedup", r.speedup_range),
            **ends("efficiency", r.efficiency_range),
            **ends("baseline_throughput", _range(r.baseline_spread)),
            **ends("sync_cost", r.sync_cost_range), "contention_loss": r.contention_loss,
            **ends("contention_loss", r.contention_range), "exchange_loss": r.exchange_loss,
            **ends("exchange_loss", r.exchange_range), "busy_runs": len(r.busy)}


def format_csv(rows: list[Row], unfinished: Iterable[RunRecord] = (),
               problems: Iterable[Problem] = ()) -> str:
    """Full-precision numbers for spreadsheets; unfinished runs appear as rows with their reason."""
    buffer = io.StringIO()
    writer = _InertWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({
            "study": r.key.study, "model": r.key.model, "dataset": r.key.dataset,
            "scaling": r.mode or "", "scaling_inferred": int(r.inferred), "sync": r.key.sync,
            "workers": r.workers, "runs": r.runs, "status": "ok", "reason": "",
            "per_device_batch": r.per_device_batch, "global_batch": r.global_batch,
            "steady_epoch_time_s": r.epoch_time_s, "epoch_time_min_s": r.epoch_time_min_s,
            "epoch_time_max_s": r.epoch_time_max_s, "step_p50_s": r.step_p50_s,
            "step_p95_s": r.step_p95_s, "throughput_samples_per_s": r.throughput,
            "throughput_min": r.throughput_min, "throughput_max": r.throughput_max,
            "per_device_throughput": r.per_device_throughput,
            "reference_workers": r.reference_workers, "speedup": r.speedup,
            "efficiency": r.efficiency, "efficiency_formula": r.formula,
            "baseline_throughput": r.baseline_throughput, "sync_cost": r.sync_cost,
            "sync_step_delta_s": r.sync_step_delta_s, "test_accuracy": r.test_accuracy,
            "tta_target": r.tta_target, "tta_reached_runs": r.tta_reached,
            "time_to_accuracy_s": r.tta_s, "time_to_accuracy_epoch": r.tta_epoch,
            "source": ";".join(str(rec.path) for rec in r.records),
            **_interval_columns(r),
        })
    for rec in unfinished:
        writer.writerow({"study": rec.study, "model": rec.model, "dataset": rec.dataset,
                         "scaling": rec.scaling or "", "sync": rec.sync, "workers": rec.workers,
                         "runs": 1, "status": rec.status, "reason": rec.reason, "source": rec.path})
    for p in problems:
        writer.writerow({"study": p.study, "status": p.kind, "reason": p.reason, "source": p.path})
    return buffer.getvalue()


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class _InertWriter(csv.DictWriter):
    """OWASP's rule against CSV injection: a text cell that a spreadsheet would run as a formula
    (it begins with = + - @, a tab or a carriage return; model names and reasons come from
    records) gets a leading apostrophe. Numbers stay numbers, negative ones included. Control
    characters are written as escapes too: csv leaves a lone carriage return unquoted, and a
    spreadsheet starts a new row there, with a first cell the record chose."""

    def writerow(self, rowdict: Mapping[str, Any]) -> Any:
        return super().writerow({key: _inert(value) for key, value in rowdict.items()})


def _inert(value: Any) -> Any:
    if value is None or isinstance(value, (int, float)):
        return value
    text = str(value)
    return ("'" if text.startswith(FORMULA_START) else "") + _plain(text)
