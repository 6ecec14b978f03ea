"""The words shared by every output: titles, notes under tables, one verdict sentence per
series, and the busy-machine warnings. Every number in them comes from :mod:`.rows`."""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

from parascale import sync
from parascale.report.load import RunRecord
from parascale.runtime.machine import others_text
from parascale.report.rows import (
    SPEEDUP,
    GroupKey,
    Range,
    Row,
    grouped,
    key_of,
    within_noise,
)

SPREAD_NOTE = ("(a–b): min–max over the runs, or over one run's steady epochs (\"ep\"); speedup, "
               "efficiency and costs: the formula at the extremes of those ranges; "
               "~ within noise (the range includes no change)")
OUTSIDE = ("Not in this study's plan (runs of an earlier plan in the same folder, kept apart "
           "and left out of the tables)")

def group_title(key: GroupKey, rows: list[Row], all_keys: Iterable[GroupKey]) -> str:
    """'smallcnn on digits, weak scaling' plus sync/study only when they tell series apart."""
    keys = list(all_keys)
    mode = rows[0].mode if rows else key.scaling
    title = f"{key.model} on {key.dataset}, "
    if mode is None:
        title += "scaling mode not recorded"
    else:
        title += f"{mode} scaling" + (" (inferred from batch sizes)" if rows and rows[0].inferred else "")
    if len({k.sync for k in keys}) > 1 or key.sync != sync.DEFAULT:
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
        note += (f"; no 1-worker run, so no speedup: 'vs {ref}' is the measured X_N/X_ref "
                 f"against {ref} workers ('ref'), and efficiency is relative to {ref} workers, "
                 f"{ref}·X_N/(N·X_ref)")
    return note + "; " + SPREAD_NOTE


def sentences(rows: list[Row], unfinished: Iterable[RunRecord] = ()) -> list[str]:
    """One plain sentence per group saying how well it scaled, with a note when notable.

    Groups in which nothing finished get a sentence too, so a study of failures still says so.
    A warning about runs on a busy machine comes first.
    """
    groups = grouped(rows)
    # an unfinished run has no measured settings to place it in a series: it joins the first
    # series of its family
    first: dict = {}
    for key in groups:
        first.setdefault(key._replace(variant=""), key)
    missing: dict[GroupKey, list[RunRecord]] = defaultdict(list)
    for record in unfinished:
        if not record.baseline:
            key = key_of(record)
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


def span_text(interval: Range | None, fmt: Callable[[float], str]) -> str:
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
        text = (f"only {_plural(top.workers, 'worker')} measured "
                f"({top.throughput * top.units_per_sample:,.0f} {top.unit}/s), so there is "
                "nothing to compare against")
        if top.workers != 1:
            text += (f": a speedup needs a 1-worker run (--workers 1,{top.workers}, or "
                     "--scaling weak|strong for a whole study)")
        return text + "."
    rel = f" relative to {ref.workers} workers" if ref.workers != 1 else ""
    than = f"{ref.workers}" if ref.workers == 1 else f"{ref.workers} workers"
    ratio, interval = top.ratio, top.ratio_range
    span = span_text(interval, lambda v: f"{v:.2f}")
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


def points_text(value: float) -> str:
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
        span = span_text(interval, points_text)
        if within_noise(interval, 0.0):
            parts.append(f"{points_text(value)} points is {what} (within noise: {span})"
                         if value >= 0 else f"{what}: not measurable here (within noise: {span})")
        else:
            parts.append(f"{points_text(value)} points is {what}" + (f" ({span})" if span else ""))
    return f" Of the {lost:.0%} lost at N={row.workers}, " + ", ".join(parts) + "."


def _sync_sentence(row: Row) -> str:
    cost = row.sync_cost
    if cost is None:
        return ""
    interval = row.sync_cost_range
    span = span_text(interval, lambda v: f"{v:.0%}")
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
    host = _busiest_host(record)
    return text + (f"; {others_text(host)}" if host is not None else "")


def _busiest_host(record: RunRecord) -> dict | None:
    """The host whose other programs used the most, where the record has hosts."""
    hosts = [h for h in record.get("machine", "hosts", default=[]) or [] if isinstance(h, dict)]
    return max(hosts, key=lambda h: (h.get("other_cores") or 0) + (h.get("steal_cores") or 0),
               default=None)


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
    host = _busiest_host(worst)
    text = (f"Warning: {len(busy)} of {total} runs ran on a busy machine (other programs used "
            f"up to {worst.get('machine', 'other_cores', default=0.0):.2f} cores meanwhile")
    if host is not None:
        text += f"; {others_text(host)}"
    return text + ("), so their throughput may be understated and the comparisons skewed; "
                   "parascale bench --quiet-machine waits for a quiet machine before each run.")

