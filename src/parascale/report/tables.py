"""A study's rows as terminal panels, Markdown and CSV (the numbers are in :mod:`.rows`, the
sentences in :mod:`.wording`)."""
from __future__ import annotations

import csv
import io
import re
import textwrap
from typing import Any, Callable, Iterable, Mapping

from parascale.report.load import Problem, RunRecord
from parascale.report.rows import SPLIT, Range, Row, Spread, grouped, range_of, within_noise
from parascale.report.wording import (
    OUTSIDE,
    busy_lines,
    busy_sentence,
    group_title,
    points_text,
    reference_note,
    sentences,
    span_text,
)

WIDTH = 120  # terminal tables fit this many columns; wider ones wrap into panels


# ---- cells ------------------------------------------------------------------------------------

def _noise(text: str, interval: Range | None, null: float) -> str:
    return text + ("~" if within_noise(interval, null) and interval[0] != interval[1] else "")


def _with_span(text: str, interval: Range | None, fmt: Callable[[float], str]) -> str:
    span = span_text(interval, fmt)
    return text + (f" ({span})" if span else "")


def _runs_cell(row: Row) -> str:
    spread = row.spread
    return str(row.runs) + (f" ({spread.n} ep)" if spread and spread.source == "epochs" else "")


def _throughput_cell(value: float, spread: Spread | None, runs: int, per: float = 1.0) -> str:
    """In the task's unit: ``per`` of them in a sample (tokens per sample; 1 for samples)."""
    text = f"{value * per:,.0f}"
    if spread is not None and (runs > 1 or spread.low != spread.high):
        text += f" ({spread.low * per:,.0f}–{spread.high * per:,.0f})"
    return text


def _speedup_cell(row: Row) -> str:
    """S against one worker; without a 1-worker run, the measured ratio to the reference row,
    saying so ('1.62× vs 2'), never scaled up to a speedup over one worker."""
    if row.is_reference:
        return "1.00×" if row.workers == 1 else "ref"
    vs = "" if row.speedup is not None else f" vs {row.reference_workers}"
    return _noise(_with_span(f"{row.ratio:.2f}×{vs}", row.ratio_range, lambda v: f"{v:.2f}"),
                  row.ratio_range, 1.0)


def _efficiency_cell(row: Row) -> str:
    if row.efficiency is None:
        return "ref"
    return _noise(_with_span(f"{row.efficiency:.1%}", row.efficiency_range,
                             lambda v: f"{100 * v:.1f}"), row.efficiency_range, 1.0)


def loss_text(value: float | None, interval: Range | None) -> str:
    if value is None:
        return "—"
    return _noise(_with_span(f"{points_text(value)} pts", interval, points_text), interval, 0.0)


def _sync_cell(row: Row) -> str:
    if row.sync_cost is None:
        return "—"
    interval = row.sync_cost_range
    span = span_text(interval, lambda v: f"{100 * v:.1f}")
    delta = row.sync_step_delta_s
    ms = f"{delta * 1000:+.1f} ms/step" if delta is not None else ""
    inner = "; ".join(p for p in (span, ms) if p)
    return _noise(f"{row.sync_cost:.1%}" + (f" ({inner})" if inner else ""), interval, 0.0)


def _target_header(rows: list[Row]) -> str:
    targets = {(r.tta_target, r.tta_metric, r.tta_higher) for r in rows
               if r.tta_target is not None}
    if len(targets) != 1:
        return "time to acc" if {t[1] for t in targets} <= {"accuracy"} else "time to target"
    target, metric, higher = next(iter(targets))
    if metric == "accuracy":
        return f"time to {target:.0%}"
    return f"time to {escaped(metric)} {'≥' if higher else '≤'} {target:g}"


def _judged_header(rows: list[Row]) -> str:
    """'test acc' for the image tasks; the name of the metric that judges a user's task."""
    judges = {r.judge for r in rows}
    return "test acc" if judges == {"accuracy"} or len(judges) != 1 else \
        f"test {escaped(next(iter(judges)))}"


def _judged_cell(row: Row) -> str:
    if row.judge == "accuracy":
        return "—" if row.test_accuracy is None else f"{row.test_accuracy:.1%}"
    return "—" if row.judge_value is None else f"{row.judge_value:.4g}"


def _unit_header(header: str, rows: list[Row]) -> str:
    """'samples/s' in the group's unit ('tokens/s'); mixed units keep the word samples."""
    units = {r.unit for r in rows}
    return header.replace("samples/s", f"{escaped(next(iter(units)))}/s") \
        if len(units) == 1 else header


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
    ("data/compute/sync/opt (ms)", lambda r: "—" if r.step_split_s is None else
     " / ".join(_ms(part) for part in r.step_split_s), lambda r: r.step_split_s is not None),
    ("samples/s", lambda r: _throughput_cell(r.throughput, r.spread, r.runs,
                                             r.units_per_sample), lambda r: True),
    ("per device", lambda r: f"{r.per_device_throughput * r.units_per_sample:,.0f}",
     lambda r: True),
    ("baseline samples/s", lambda r: "—" if r.baseline_throughput is None else
     _throughput_cell(r.baseline_throughput, r.baseline_spread, r.baseline_runs,
                      r.units_per_sample),
     lambda r: r.baseline_throughput is not None),
    ("speedup", _speedup_cell, lambda r: True),
    ("efficiency", _efficiency_cell, lambda r: True),
    ("lost: sharing", lambda r: loss_text(r.contention_loss, r.contention_range),
     lambda r: r.contention_loss is not None),
    ("lost: exchange", lambda r: loss_text(r.exchange_loss, r.exchange_range),
     lambda r: r.exchange_loss is not None),
    ("sync cost", _sync_cell, lambda r: r.sync_cost is not None),
    ("test acc", _judged_cell, lambda r: True),
    ("time to acc", lambda r: _tta(r), lambda r: r.tta_runs > 0),
    ("peak mem", lambda r: "—" if r.peak_memory_bytes is None else
     f"{r.peak_memory_bytes / (1 << 20):,.0f} MiB", lambda r: r.peak_memory_bytes is not None),
    ("held (MiB)", lambda r: _held_cell(r), lambda r: r.memory_split is not None),
    ("MFU", lambda r: "—" if r.mfu is None else
     f"{r.mfu:.1%}" + (" (measured peak)" if r.mfu_measured_peak else ""),
     lambda r: r.mfu is not None),
]
HEADERS = [header for header, _, _ in COLUMNS]


def table(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of one group's table, without the columns it has nothing for."""
    alone = len(rows) == 1  # nothing to compare with: a speedup of 1.00x would say nothing
    shown = [(h, cell) for h, cell, when in COLUMNS if any(when(r) for r in rows)
             and not (alone and h in ("speedup", "efficiency"))]
    named = {"time to acc": _target_header(rows), "test acc": _judged_header(rows)}
    headers = [named.get(h) or _unit_header(h, rows) for h, _ in shown]
    return headers, [[cell(r) for _, cell in shown] for r in rows]


def cells(row: Row) -> list[str]:
    """A row as display strings, every column (see :data:`HEADERS`)."""
    return [cell(row) for _, cell, _ in COLUMNS]


def _held_cell(row: Row) -> str:
    """Rank 0's parameters + gradients + optimizer state + activations, and each, in MiB."""
    if row.memory_split is None:
        return "—"
    mib = [row.memory_split[k] / (1 << 20) for k in SPLIT]
    return f"{_mib(sum(mib))} (" + " + ".join(map(_mib, mib)) + ")"


def _mib(value: float) -> str:
    """Whole MiB from 100 up, three significant digits below (a small model's 0.14 MiB)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


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
        blocks.append("\n".join(wrap(escaped(group_title(key, group, groups)))
                                + wrap(reference_note(group), indent="  ")
                                + panels(headers, body)))
    busy = busy_lines(rows)
    if busy:
        blocks.append("\n".join(wrap(busy_sentence(rows))
                                + [ln for line in busy for ln in wrap(escaped(line), indent="  ")]))
    lost = issue_lines(unfinished, problems)
    if lost:
        # not wrapped: each line ends in a path, which a reader copies whole
        blocks.append("Not finished or unreadable:\n"
                      + "\n".join("  " + escaped(line) for line in lost))
    outside = list(outside)
    if outside:
        blocks.append(OUTSIDE + ":\n" + "\n".join("  " + escaped(line) for line in outside))
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
    return escaped(text)


# Control characters other than tab and newline, and the bidirectional overrides: text from a
# record must not be able to send escape sequences to a terminal or reorder what it shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# ... and tab and newline too, in one value (a cell, a label): there they would split a CSV or
# Markdown row, and a plot's font has no glyph for them
_CONTROL_IN_VALUE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _plain(text: str) -> str:
    """``text`` with control characters written as escapes (\\x1b), for terminals and files;
    its lines (tab and newline) kept."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def escaped(text: str) -> str:
    """One value from a record with every control character written as an escape (\\t, \\n,
    \\x1b), so that it stays one cell, one line, one label."""
    return _CONTROL_IN_VALUE.sub(lambda m: ascii(m.group())[1:-1], text)


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
    "exchange_loss_high", "busy_runs", "peak_memory_bytes",
]
# the task's unit and the metric that judges it (image tasks: samples, accuracy)
CSV_COLUMNS += ["unit", "units_per_sample", "judge", "judge_value", "tta_metric"]
CSV_COLUMNS += ["flops_per_step", "mfu", "mfu_peak_measured"]
# memory per device: the smallest rank's peak beside the largest's, and rank 0's split
CSV_COLUMNS += ["peak_memory_min_bytes", *SPLIT]


def _interval_columns(r: Row) -> dict[str, Any]:
    def ends(prefix: str, interval: Range | None) -> dict[str, Any]:
        return {f"{prefix}_low": interval[0] if interval else None,
                f"{prefix}_high": interval[1] if interval else None}

    return {"spread_source": r.spread.source if r.spread else "",
            "spread_n": r.spread.n if r.spread else "",
            **ends("throughput", range_of(r.spread)), **ends("speedup", r.speedup_range),
            **ends("efficiency", r.efficiency_range),
            **ends("baseline_throughput", range_of(r.baseline_spread)),
            **ends("sync_cost", r.sync_cost_range), "contention_loss": r.contention_loss,
            **ends("contention_loss", r.contention_range), "exchange_loss": r.exchange_loss,
            **ends("exchange_loss", r.exchange_range), "busy_runs": len(r.busy),
            "peak_memory_bytes": r.peak_memory_bytes, "unit": r.unit,
            "units_per_sample": r.units_per_sample, "judge": r.judge,
            "judge_value": r.judge_value, "tta_metric": r.tta_metric,
            "flops_per_step": r.flops_per_step, "mfu": r.mfu,
            "mfu_peak_measured": int(r.mfu_measured_peak),
            "peak_memory_min_bytes": min(r.peak_per_rank) if r.peak_per_rank else None,
            **{k: r.memory_split[k] if r.memory_split else None for k in SPLIT}}


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
    return ("'" if text.startswith(FORMULA_START) else "") + escaped(text)
