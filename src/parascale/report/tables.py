"""Summary rows computed from run records, and their terminal, CSV and Markdown forms.

Definitions (also printed with every table):

- X_N: global steady throughput, ``summary.steady_throughput`` (samples/s over the slowest rank,
  warm-up epoch excluded). Per-device throughput is X_N / N.
- Reference: the 1-worker row of a group if it has one, else its smallest N (N_ref), and then the
  table says "relative to N_ref workers".
- Speedup S_N = N_ref * X_N / X_ref (= X_N / X_1 when N_ref = 1). Efficiency E_N = S_N / N.
  For weak scaling that is E = t1/tN, for strong scaling E = t1/(N*tN), t being the time per step:
  the same number as X_N/(N*X_1), so one computation serves both. Efficiency is never capped at
  100 %: super-linear results happen (caches) and hiding them would hide a finding.
- Sync cost, where a baseline run exists for the same group and N (``study.baseline``: same
  processes, gradients never exchanged): 1 - X_sync / X_baseline, and the difference of the
  median step times (``steps.phases.step.p50``).
- Repeats (same group and N): the median of each figure, with min-max and the count n.
"""
from __future__ import annotations

import csv
import io
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Iterable, Mapping, NamedTuple

from parascale.report.load import Problem, RunRecord
from parascale.report.series import variants

FORMULAS = {
    "weak": "E = t1/tN (t = time per step, per-device batch fixed)",
    "strong": "E = t1/(N·tN) (t = time per step, global batch fixed)",
    None: "E = X_N/(N·X_1) (X = global throughput in samples/s; scaling mode not recorded)",
}
SPEEDUP = "S = N_ref·X_N/X_ref, E = S/N"


class GroupKey(NamedTuple):
    """What makes a series: one line on each plot, one table in the report."""

    study: str
    model: str
    dataset: str
    scaling: str | None
    sync: str
    variant: str = ""  # what tells this series from others of its family (see series.py)


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

    @property
    def per_device_throughput(self) -> float:
        return self.throughput / self.workers

    @property
    def speedup(self) -> float:
        return self.reference_workers * self.throughput / self.reference_throughput

    @property
    def efficiency(self) -> float:
        """S_N / N; deliberately not capped at 1 (super-linear scaling is reported as such)."""
        return self.speedup / self.workers

    @property
    def sync_cost(self) -> float | None:
        if self.baseline_throughput is None:
            return None
        return 1.0 - self.throughput / self.baseline_throughput

    @property
    def sync_step_delta_s(self) -> float | None:
        if self.baseline_step_p50_s is None or self.step_p50_s is None:
            return None
        return self.step_p50_s - self.baseline_step_p50_s

    @property
    def formula(self) -> str:
        return FORMULAS.get(self.mode, FORMULAS[None])


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
        mode, inferred = (key.scaling, False) if key.scaling else (_infer_mode(by_n), True)
        for n in sorted(by_n):
            base = baselines.get((key.study, key.model, key.dataset, key.scaling, key.variant, n),
                                 [])
            rows.append(_row(key, n, by_n[n], ref_n, ref_x, mode, inferred and mode is not None, base))
    return rows


def _key(record: RunRecord, variant: str = "") -> GroupKey:
    return GroupKey(record.study, record.model, record.dataset, record.scaling, record.sync, variant)


def _row(key: GroupKey, n: int, runs: list[RunRecord], ref_n: int, ref_x: float,
         mode: str | None, inferred: bool, base: list[RunRecord]) -> Row:
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
    note = f"{rows[0].formula}; speedup {SPEEDUP}"
    if ref != 1:
        note += f"; no 1-worker run, so relative to {ref} workers (assumes those scaled perfectly)"
    return note


def sentences(rows: list[Row], unfinished: Iterable[RunRecord] = ()) -> list[str]:
    """One plain sentence per group saying how well it scaled, with a note when notable.

    Groups in which nothing finished get a sentence too, so a study of failures still says so.
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


def _how_it_scaled(group: list[Row]) -> str:
    ref = next(r for r in group if r.workers == r.reference_workers)
    top = group[-1]
    if len(group) == 1:
        return (f"only {_plural(top.workers, 'worker')} measured ({top.throughput:,.0f} samples/s), "
                "so there is nothing to compare against.")
    text = (f"{_plural(top.workers, 'worker')} reach {top.throughput / ref.throughput:.2f}× "
            f"the throughput of {ref.workers} (efficiency {top.efficiency:.0%}"
            + (f" relative to {ref.workers} workers" if ref.workers != 1 else "") + ").")
    if round(top.efficiency, 2) > 1:  # only when the printed figure says so too
        text += (" Super-linear (above 100%): each worker did more than one alone, "
                 "usually because its share of the data fits a cache; worth a second look.")
    elif top.efficiency < 0.5:
        text += (" Below 50%: more than half of every added worker is lost, typically to "
                 "communication or to contention for shared cores and memory.")
    if top.sync_cost is not None:
        text += f" Gradient exchange costs {top.sync_cost:.0%} of throughput at N={top.workers}."
    return text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---- cells ------------------------------------------------------------------------------------

HEADERS = ["workers", "runs", "epoch (s)", "step p50 (ms)", "step p95 (ms)", "samples/s",
           "per device", "speedup", "efficiency", "sync cost", "test acc", "time to acc"]


def cells(row: Row) -> list[str]:
    """A row as display strings; spreads shown as (min–max) when there are repeats."""
    def spread(median_: str, low: str, high: str) -> str:
        return median_ + (f" ({low}–{high})" if row.runs > 1 else "")

    sync = "—"
    if row.sync_cost is not None:
        sync = f"{row.sync_cost:.1%}"
        if row.sync_step_delta_s is not None:
            sync += f" ({row.sync_step_delta_s * 1000:+.1f} ms/step)"
    return [
        str(row.workers),
        str(row.runs),
        spread(_sig(row.epoch_time_s), _sig(row.epoch_time_min_s), _sig(row.epoch_time_max_s)),
        _ms(row.step_p50_s),
        _ms(row.step_p95_s),
        spread(f"{row.throughput:,.0f}", f"{row.throughput_min:,.0f}", f"{row.throughput_max:,.0f}"),
        f"{row.per_device_throughput:,.0f}",
        f"{row.speedup:.2f}×",
        f"{row.efficiency:.1%}",
        sync,
        "—" if row.test_accuracy is None else f"{row.test_accuracy:.1%}",
        _tta(row),
    ]


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

def format_terminal(rows: list[Row], unfinished: Iterable[RunRecord] = (),
                    problems: Iterable[Problem] = ()) -> str:
    """Aligned plain-text tables, one per group, then everything that did not finish."""
    groups = grouped(rows)
    blocks = []
    for key, group in groups.items():
        table = [HEADERS] + [cells(r) for r in group]
        widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in table]
        blocks.append("\n".join([group_title(key, group, groups), "  " + reference_note(group)]
                                + ["  " + line for line in lines]))
    lost = issue_lines(unfinished, problems)
    if lost:
        blocks.append("Not finished or unreadable:\n" + "\n".join("  " + line for line in lost))
    if not blocks:
        return "No finished runs."
    return _plain("\n\n".join(blocks))


def issue_lines(unfinished: Iterable[RunRecord], problems: Iterable[Problem]) -> list[str]:
    """Every run that contributed no numbers, with its reason: never silently dropped."""
    lines = [f"{r.describe()}: {r.status}: {r.reason} ({r.path})" for r in unfinished]
    lines += [f"{p.path}: {p.reason}" for p in problems]
    return lines


def format_markdown(rows: list[Row], unfinished: Iterable[RunRecord] = (),
                    problems: Iterable[Problem] = ()) -> str:
    """GitHub-flavoured Markdown: a heading, a note and a table per group."""
    groups = grouped(rows)
    out = ["# Scaling summary", ""]
    for key, group in groups.items():
        out += [f"## {_md(group_title(key, group, groups))}", "", _md(reference_note(group)), ""]
        out.append("| " + " | ".join(HEADERS) + " |")
        out.append("|" + "|".join("---:" for _ in HEADERS) + "|")
        out += ["| " + " | ".join(_md(c) for c in cells(r)) + " |" for r in group]
        out.append("")
    if not groups:
        out += ["No finished runs.", ""]
    lost = issue_lines(unfinished, problems)
    if lost:
        out += ["## Not finished or unreadable", ""] + [f"- {_md(line)}" for line in lost] + [""]
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
