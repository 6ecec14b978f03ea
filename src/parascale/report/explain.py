"""What explains a run beyond its throughput: the gradient noise scale it measured (the record's
``noise`` section) and the per-rank traces it wrote (``profile``, from ``--profile``).

Both are per run, not per series: the noise scale belongs to a batch and a point in training,
and a trace to one run's steps. Records without them (older ones, one-worker runs) add nothing.
"""
from __future__ import annotations

import os
import re
from html import escape
from pathlib import Path

from parascale.report.load import RunRecord

# what --profile writes; anything else in a record's list is not linked (a record is input)
TRACE_NAME = re.compile(r"traces/rank-\d+\.json(\.gz)?")


def _noise(record: RunRecord) -> dict | None:
    noise = record.get("noise")
    return noise if isinstance(noise, dict) and _number(noise.get("noise_scale")) else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _label(record: RunRecord) -> str:
    repeat = record.get("study", "repeat")
    return f"{record.config_id}" + (f" (repeat {repeat})" if repeat is not None else "")


def noise_text(noise: dict) -> str:
    """'36 ± 6 (epoch 2)': the figure, its jackknife error where known, and when."""
    se = noise.get("noise_scale_se")
    spread = f" ± {se:,.0f}" if _number(se) else ""
    epoch = noise.get("epoch")
    return f"{noise['noise_scale']:,.0f}{spread}" + (f" (epoch {epoch})" if epoch else "")


def noise_sentences(records: list[RunRecord]) -> list[str]:
    """One sentence per model and dataset whose runs measured the noise scale: every run's
    figure, then the advice of the run with the largest global batch (the one a user would
    scale from)."""
    measured: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        if r.status == "ok" and _noise(r):
            measured.setdefault((r.model, r.dataset), []).append(r)
    out = []
    for (model, dataset), runs in measured.items():
        runs.sort(key=lambda r: (_noise(r).get("global_batch") or 0, r.config_id))
        figures = "; ".join(f"{_label(r)} at global batch {_noise(r).get('global_batch')}: "
                            f"{noise_text(_noise(r))}" for r in runs)
        advice = _noise(runs[-1]).get("advice")
        out.append(f"Gradient noise scale of {model} on {dataset} (samples; McCandlish et al. "
                   f"2018): {figures}." + (f" By the last: {advice}." if advice else ""))
    return out


def noise_html(records: list[RunRecord]) -> str:
    rows = []
    for r in records:
        noise = r.get("noise")
        if r.status != "ok" or not isinstance(noise, dict):
            continue
        if _noise(r):
            said = noise_text(noise), noise.get("advice") or ""
        else:
            said = "—", noise.get("reason") or "not measured"
        rows.append(f"<tr><td>{escape(_label(r))}</td><td>{escape(str(r.workers))}</td>"
                    f"<td>{escape(str(noise.get('global_batch')))}</td>"
                    f"<td>{escape(said[0])}</td><td>{escape(said[1])}</td></tr>")
    if not rows:
        return "<p>No run recorded a gradient noise scale.</p>"
    head = ("<tr><th>run</th><th>N</th><th>global batch</th><th>noise scale B<sub>simple</sub>"
            "</th><th>what it says</th></tr>")
    return ('<p class="note">B<sub>simple</sub> = tr(Σ)/|G|², from each rank\'s gradient before '
            "the exchange and the averaged one after it, averaged over an epoch's steps; ± is a "
            "jackknife standard error over blocks of steps. Steps to a loss scale as "
            "S<sub>min</sub>·(1 + B<sub>noise</sub>/B): beyond B<sub>noise</sub> a larger batch "
            'saves few steps (docs/record.md).</p><div class="wide"><table>'
            + head + "".join(rows) + "</table></div>")


def traces_html(records: list[RunRecord], out_dir: Path | None) -> str:
    """Links to every run's traces, relative to the report's folder so the pages move together."""
    rows = []
    for r in records:
        profile = r.get("profile")
        if not isinstance(profile, dict) or not isinstance(profile.get("traces"), list):
            continue
        links = []
        for i, name in enumerate(profile["traces"]):
            if not isinstance(name, str) or not TRACE_NAME.fullmatch(name):
                continue
            target = r.path.parent / name
            href = os.path.relpath(target, out_dir) if out_dir else target.as_posix()
            links.append(f'<a href="{escape(Path(href).as_posix())}">rank {i}</a>')
        steps = profile.get("steps")
        window = f"{steps[0]}-{steps[1]}" if isinstance(steps, list) and len(steps) == 2 else "?"
        note = profile.get("note") or ""
        rows.append(f"<tr><td>{escape(_label(r))}</td><td>{escape(window)}</td>"
                    f"<td>{' '.join(links) or '—'}</td><td>{escape(str(note))}</td></tr>")
    if not rows:
        return ("<p>No run was profiled (<code>--profile FIRST:LAST</code> writes one trace per "
                "rank).</p>")
    return ('<p class="note">Chrome/Perfetto traces written by torch.profiler; open them in '
            "https://ui.perfetto.dev or chrome://tracing. parascale's phases are the ranges "
            "parascale.data, .compute, .sync and .optimizer.</p><table><tr><th>run</th>"
            "<th>steps</th><th>traces</th><th>note</th></tr>" + "".join(rows) + "</table>")
