"""The report page: one self-contained HTML file a person reads top to bottom.

Order: what was run (configurations, environment), how it scaled in one sentence per series,
the tables, the plots, then everything that did not finish. Images are embedded as data: URIs
so the file can be mailed or attached to an issue on its own. Every piece of text that comes from
a record (model names, reasons, host names...) goes through :func:`html.escape`: records are
written by other programs and must not be able to inject markup or script into the page.
"""
from __future__ import annotations

import base64
import datetime as _dt
from collections import defaultdict
from html import escape
from pathlib import Path
from typing import Any, Iterable

from parascale.record import VERSION
from parascale.report.explain import noise_rows, trace_rows
from parascale.report.inplan import outside_lines
from parascale.report.load import Loaded, RunRecord
from parascale.report.plots import Plot
from parascale.report.rows import Row, grouped
from parascale.report.tables import table
from parascale.report.wording import (OUTSIDE, busy_lines, busy_sentence, group_title,
                                      reference_note, sentences)

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;
     padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right;vertical-align:top}
th{background:#f4f4f4}table.results td{white-space:nowrap}td.text,th.text{text-align:left;white-space:normal}
table.results{font-size:.82em}table.results th{white-space:normal;min-width:3.2em}
table.results th,table.results td{padding:.25em .4em}
table.results small{display:block;color:#666;font-size:.85em;white-space:normal}
.wide{overflow-x:auto}.warn{background:#fff4e5;border-left:4px solid #d97706;padding:.3em 1em}
.note{color:#555;font-size:.9em;margin:.2em 0}.bad{color:#a40000}
figure{margin:1em 0 2em}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.9em}
"""

ENV_KEYS = ["python", "torch", "torchvision", "parascale", "backend", "device_type", "cpu_model",
            "cpu_count", "hosts", "launcher", "git_revision"]

DEFINITIONS = [
    ("X_N", "global steady throughput: training samples per second over all N workers, total "
            "samples divided by the slowest worker's time, warm-up (first) epoch excluded; "
            "shown in the task's unit (a language model's tokens/s: samples/s times the "
            "tokens in a sample)"),
    ("per device", "X_N / N"),
    ("speedup S", "N_ref · X_N / X_ref; the reference is the 1-worker run, or the smallest N "
                  "measured when there is none (then said under the table)"),
    ("efficiency E", "S / N. Weak scaling (per-device batch fixed): E = t1/tN; strong scaling "
                     "(global batch fixed): E = t1/(N·tN), t = time per step. Not capped at "
                     "100%: super-linear results are shown as measured"),
    ("baseline samples/s (tokens/s)", "throughput of the contention baseline: the same N processes, "
                           "gradients never exchanged"),
    ("lost: sharing / lost: exchange", "where the efficiency lost (1 − E) went, in points of "
     "efficiency: ideal → baseline → measured. Sharing = 1 − X_b/(N·X_1), what N processes "
     "sharing the machine cost without exchanging anything; exchange = (X_b − X_s)/(N·X_1), what "
     "gradient exchange costs on top. The two add up to 1 − E"),
    ("sync cost", "1 − X_sync / X_baseline, where the baseline ran the same processes without "
                  "exchanging gradients; then the extra median time per step"),
    ("step p50 / p95", "median and 95th percentile of per-step time over every rank"),
    ("test acc", "test accuracy after the last epoch"),
    ("peak mem", "the largest rank's peak memory (resident set on a CPU, allocated by the CUDA "
                 "allocator on a GPU), median over the runs"),
    ("held (MiB)", "what rank 0 held on its first step, counted from the tensors themselves: "
                   "parameters + gradients + optimizer state + activations (its part of them "
                   "under a strategy that shards them), median over the runs; the peak's rest "
                   "is the interpreter, libraries, buffers and temporaries (docs/record.md)"),
    ("time to T%", "training time until the target test accuracy T was first reached, and at "
                   "which epoch: the first evaluation at or above T (report --target T, or the "
                   "runs' own target), never interpolated between evaluations; 'not reached' "
                   "when no evaluation reached it; the column is left out when no target was "
                   "set"),
    ("runs", "repeats behind the figures: medians shown, min–max below them. '1 (4 ep)': a single "
             "run, whose spread is the min–max of its 4 steady epochs (it shows how much the run "
             "wandered; only repeats show how much runs differ)"),
    ("intervals", "speedup, efficiency, sync cost and the lost shares get the conservative "
                  "interval: the formula evaluated at the extremes of its inputs' ranges (for a "
                  "ratio of medians, lowest/highest to highest/lowest), resting on the n shown "
                  "in 'runs' for each row involved. No distribution is assumed"),
    ("~ (within noise)", "the interval includes no change (speedup 1× the reference, efficiency "
                         "100%, a cost of 0): the difference is not measurable here and is never "
                         "stated as a result"),
    ("ref, vs N", "a study without a 1-worker run has no speedup: 'ref' marks its smallest N, "
                  "'× vs N' is the measured throughput relative to it, and the efficiency is "
                  "relative to it too (N·X/(workers·X_ref)); nothing assumes that N workers "
                  "scaled perfectly"),
    ("busy machine", "a run during which other programs used at least a tenth of the cores "
                     "(at least a quarter of one), measured from the kernel's CPU counters "
                     "(the record's machine block)"),
]


def render_html(loaded: Loaded, rows: list[Row], plots: list[Plot],
                files: Iterable[str] = (), out_dir: Path | None = None) -> str:
    """The whole page as a string; pure, so tests can check it without a browser. ``out_dir``,
    where the page goes, makes its links to the runs' traces relative."""
    studies = ", ".join(s.label for s in loaded.sources)
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>Scaling report: {escape(studies)}</title><style>{CSS}</style></head><body>",
        f"<h1>Scaling report: {escape(studies)}</h1>",
        f'<p class="note">Made by parascale {escape(VERSION)} on {now} from '
        f"{len(loaded.records)} run records ({len(loaded.ok)} finished); nothing was re-run.</p>",
        "<h2>Summary</h2>", _busy(rows), _sentences(rows, loaded.unfinished),
        "<h2>What was run</h2>", _configurations(loaded), "<h3>Environment</h3>", _environment(loaded),
        "<h2>Results</h2>", _tables(rows), "<h3>How to read the tables</h3>", _definitions(),
        "<h2>Plots</h2>", _plots(plots),
        "<h2>Explaining the runs</h2>", "<h3>Gradient noise scale</h3>",
        _noise(loaded.records), "<h3>Traces</h3>", _traces(loaded.records, out_dir),
        "<h2>Not finished or unreadable</h2>", _issues(loaded), _outside(loaded),
    ]
    if files:
        links = ", ".join(f'<a href="{escape(f)}">{escape(f)}</a>' for f in files)
        parts.append(f'<p class="note">Also written next to this page: {links}.</p>')
    parts.append("</body></html>")
    return "\n".join(parts)


def _busy(rows: list[Row]) -> str:
    """Which runs ran on a busy machine, how much other load, the biggest other process."""
    lines = busy_lines(rows)
    if not lines:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return (f'<div class="warn"><p>{escape(busy_sentence(rows))}</p>'
            f"<ul>{items}</ul></div>")


def _sentences(rows: list[Row], unfinished: list[RunRecord]) -> str:
    warning = busy_sentence(rows)  # shown above, with its list of runs
    items = [s for s in sentences(rows, unfinished) if s != warning]
    if not items:
        return "<p>No run finished, so there is nothing to compare.</p>"
    return "<ul>" + "".join(f"<li>{escape(s)}</li>" for s in items) + "</ul>"


def _table(headers: list[str], body: list[list[Any]], text_columns: int = 0, cls: str = "") -> str:
    """An HTML table; the first ``text_columns`` columns are left-aligned words, the rest numbers."""
    def cell(tag: str, i: int, value: Any) -> str:
        cls = ' class="text"' if i < text_columns else ""
        return f"<{tag}{cls}>{escape(str(value)).replace(chr(10), '<br>')}</{tag}>"
    head = "<tr>" + "".join(cell("th", i, h) for i, h in enumerate(headers)) + "</tr>"
    lines = ["<tr>" + "".join(cell("td", i, v) for i, v in enumerate(line)) + "</tr>" for line in body]
    return f'<div class="wide"><table class="{cls}">' + head + "".join(lines) + "</table></div>"


def _configurations(loaded: Loaded) -> str:
    """One line per series and status: what a reader needs to reproduce or question the study.

    Each worker count is paired with its batches ('2: 16 × 2 = 32'), since under weak and strong
    scaling they change together; image size and threads per worker say what one "device" was.
    """
    seen: dict[tuple, list[RunRecord]] = defaultdict(list)
    for r in loaded.records:
        seen[(r.study, r.model, r.dataset, r.scaling or "—", r.sync, r.baseline)].append(r)
    body = []
    for (study, model, dataset, scaling, sync, baseline), records in seen.items():
        statuses: defaultdict[str, int] = defaultdict(int)
        for r in records:
            statuses[r.status] += 1
        body.append([study, model + (" (baseline: no gradient exchange)" if baseline else ""),
                     dataset, scaling, sync, _batches(records),
                     _distinct(r.get("config", "image_size", default="as stored")
                               for r in records),
                     _distinct(r.get("derived", "threads_per_worker",
                                     default=r.get("config", "threads")) for r in records),
                     _distinct(r.get("config", "epochs") for r in records),
                     _distinct(r.get("config", "lr") for r in records),
                     _distinct(_percent(r.get("config", "target_accuracy")) for r in records),
                     # what ran (the environment), not what was asked for ("auto")
                     " · ".join(_distinct(r.get("environment", env, default=r.get("config", k))
                                          for r in records)
                                for k, env in (("device", "device_type"), ("backend", "backend"),
                                               ("precision", "precision"))),
                     ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))])
    headers = ["study", "model", "dataset", "scaling", "sync",
               "workers N: per-device batch × N = global batch", "image size (px)",
               "threads per worker", "epochs", "lr", "target accuracy",
               "device · backend · precision", "runs"]
    return _table(headers, body, text_columns=6)


def _batches(records: list[RunRecord]) -> str:
    """'1: 16 × 1 = 16', '2: 16 × 2 = 32', one line each: each worker count with its batches."""
    pairs: dict[int, set[str]] = defaultdict(set)
    for r in records:
        n = r.workers
        if n is None:
            continue
        per = r.get("derived", "per_device_batch", default=r.get("config", "batch_size"))
        total = r.get("derived", "global_batch", default=r.get("config", "global_batch"))
        accumulate = r.get("config", "accumulate", default=1)
        times = f" × {n}" + (f" × {accumulate} accumulated" if accumulate not in (1, None) else "")
        pairs[n].add(f"{per if per is not None else '?'}{times} = "
                     f"{total if total is not None else '?'}".replace(" ", "\u00a0"))
    return "\n".join(f"{n}: {' or '.join(sorted(pairs[n]))}" for n in sorted(pairs)) or "—"


def _percent(value: Any) -> str | None:
    return f"{value:.0%}" if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _environment(loaded: Loaded) -> str:
    records = loaded.ok or loaded.records
    body = [[key, _distinct(r.get("environment", key) for r in records)] for key in ENV_KEYS]
    starts = sorted(str(r.get("environment", "start_time")) for r in records
                    if r.get("environment", "start_time"))
    if starts:
        body.append(["runs started", starts[0] if len(starts) == 1 else f"{starts[0]} to {starts[-1]}"])
    return _table(["", "value (all distinct values across runs)"], body, text_columns=2)


def _distinct(values: Iterable[Any]) -> str:
    """Distinct values joined (numbers ascending, text first-seen); lists (hosts) flattened."""
    out: list[Any] = []
    for value in values:
        for v in value if isinstance(value, list) else [value]:
            if v is not None and v not in out:
                out.append(v)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in out):
        out.sort()
    return ", ".join(str(v) for v in out) if out else "—"


def _tables(rows: list[Row]) -> str:
    groups = grouped(rows)
    if not groups:
        return "<p>No run finished, so there are no tables.</p>"
    parts = []
    for key, group in groups.items():
        parts.append(f"<h3>{escape(group_title(key, group, groups))}</h3>")
        parts.append(f'<p class="note">{escape(reference_note(group))}</p>')
        headers, body = table(group)
        parts.append(_results(headers, body))
    return "\n".join(parts)


def _results(headers: list[str], body: list[list[str]]) -> str:
    """A results table whose ranges '(a–b)' go on a small second line, so that it fits the page."""
    def cell(text: str) -> str:
        main, sep, rest = text.partition(" (")
        if not sep:
            return escape(text)
        return f"{escape(main)}<small>({escape(rest)}</small>"
    head = "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in headers) + "</tr>"
    lines = ["<tr>" + "".join(f"<td>{cell(c)}</td>" for c in line) + "</tr>" for line in body]
    return '<div class="wide"><table class="results">' + head + "".join(lines) + "</table></div>"


def _noise(records: list[RunRecord]) -> str:
    rows = noise_rows(records)
    if not rows:
        return "<p>No run recorded a gradient noise scale.</p>"
    return ('<p class="note">B<sub>simple</sub> = tr(Σ)/|G|², from each rank\'s gradient before '
            "the exchange and the averaged one after it, averaged over an epoch's steps; ± is a "
            "jackknife standard error over blocks of steps. Steps to a loss scale as "
            "S<sub>min</sub>·(1 + B<sub>noise</sub>/B): beyond B<sub>noise</sub> a larger batch "
            "saves few steps (docs/record.md).</p>"
            + _table(["run", "N", "global batch", "noise scale B_simple", "what it says"], rows,
                     text_columns=1))


def _traces(records: list[RunRecord], out_dir: Path | None) -> str:
    rows = trace_rows(records, out_dir)
    if not rows:
        return ("<p>No run was profiled (<code>--profile FIRST:LAST</code> writes one trace per "
                "rank).</p>")
    body = "".join(
        f"<tr><td>{escape(label)}</td><td>{escape(window)}</td><td>"
        + (" ".join(f'<a href="{escape(href)}">rank {rank}</a>' for rank, href in links) or "—")
        + f"</td><td>{escape(note)}</td></tr>" for label, window, links, note in rows)
    return ('<p class="note">Chrome/Perfetto traces written by torch.profiler; open them in '
            "https://ui.perfetto.dev or chrome://tracing. parascale's phases are the ranges "
            "parascale.data, .compute, .sync and .optimizer.</p><table><tr><th>run</th>"
            "<th>steps</th><th>traces</th><th>note</th></tr>" + body + "</table>")


def _definitions() -> str:
    items = "".join(f"<dt><b>{escape(t)}</b></dt><dd>{escape(d)}</dd>" for t, d in DEFINITIONS)
    return f"<dl>{items}</dl>"


def _plots(plots: list[Plot]) -> str:
    if not plots:
        return "<p>No run finished, so there are no plots.</p>"
    parts = []
    for plot in plots:
        data = base64.b64encode(plot.png).decode("ascii")
        parts.append(
            f'<figure id="{escape(plot.name)}"><img src="data:image/png;base64,{data}" '
            f'alt="{escape(plot.title)}"><figcaption><b>{escape(plot.title)}.</b> '
            f"{escape(plot.caption)} Files: {escape(plot.name)}.png, {escape(plot.name)}.svg."
            "</figcaption></figure>")
    return "\n".join(parts)


def _outside(loaded: Loaded) -> str:
    if not loaded.outside:
        return ""
    items = "".join(f"<li>{escape(line)}</li>" for line in outside_lines(loaded))
    return f"<h2>Not in this study's plan</h2><p class=\"note\">{escape(OUTSIDE)}.</p><ul>{items}</ul>"


def _issues(loaded: Loaded) -> str:
    body = [[r.study, r.describe(), r.status, r.reason, str(r.path)] for r in loaded.unfinished]
    body += [[p.study, "—", p.kind, p.reason, str(p.path)] for p in loaded.problems]
    if not body:
        return "<p>Every configuration finished and every file was readable.</p>"
    return ('<p class="bad">These contributed no numbers to the tables and plots:</p>'
            + _table(["study", "configuration", "status", "reason", "file"], body, text_columns=5))
