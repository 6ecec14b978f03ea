"""What explains a run beyond its throughput: the gradient noise scale it measured (the record's
``noise`` section) and the per-rank traces it wrote (``profile``, from ``--profile``).

Both are per run, not per series: the noise scale belongs to a batch and a point in training,
and a trace to one run's steps. Records without them (older ones, one-worker runs) add nothing.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from parascale import precision
from parascale.report.load import RunRecord

# what --profile writes; anything else in a record's list is not linked (a record is input)
TRACE_NAME = re.compile(r"traces/rank-(\d+)\.json(?:\.gz)?")


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


def _verdict(record: RunRecord, noise: dict) -> precision.Verdict:
    """How precise the section's figure is: its standard error, and the steps of its epoch
    (``noise_steps`` of the epoch entry the section names)."""
    steps = next((e.get("noise_steps") for e in record.get("epochs", default=[])
                  if isinstance(e, dict) and e.get("epoch") == noise.get("epoch")), None)
    return precision.judge(noise.get("noise_scale"), noise.get("noise_scale_se"), steps)


def advice_text(record: RunRecord, noise: dict) -> str:
    """The record's advice where its figure is precise enough to carry it; otherwise why not,
    and about how many steps would do ('' when the record gives none)."""
    advice = noise.get("advice") if isinstance(noise.get("advice"), str) else ""
    verdict = _verdict(record, noise)
    if not verdict.known:
        return advice and (f"{advice} (how precise: unknown, the record gives no standard "
                           "error or step count)")
    return advice if verdict.precise else verdict.reason("the noise scale")


def _measured(records: list[RunRecord]) -> list[tuple[RunRecord, dict]]:
    return [(r, n) for r in records if r.status == "ok" and (n := _noise(r)) is not None]


def noise_sentences(records: list[RunRecord]) -> list[str]:
    """One sentence per model and dataset whose runs measured the noise scale: every run's
    figure, then the advice of the run with the largest global batch (the one a user would
    scale from)."""
    measured: dict[tuple[str, str], list[tuple[RunRecord, dict]]] = {}
    for r, noise in _measured(records):
        measured.setdefault((r.model, r.dataset), []).append((r, noise))
    out = []
    for (model, dataset), runs in measured.items():
        runs.sort(key=lambda pair: (pair[1].get("global_batch") or 0, pair[0].config_id))
        figures = "; ".join(f"{_label(r)} at global batch {noise.get('global_batch')}: "
                            f"{noise_text(noise)}" for r, noise in runs)
        advice = advice_text(*runs[-1])
        out.append(f"Gradient noise scale of {model} on {dataset} (samples; McCandlish et al. "
                   f"2018): {figures}." + (f" By the last: {advice}." if advice else ""))
    return out


def noise_rows(records: list[RunRecord]) -> list[list[str]]:
    """Per finished run with a ``noise`` section: run, N, global batch, the figure (or —) and
    its advice (or why it was not measured)."""
    rows = []
    for r in records:
        noise = r.get("noise")
        if r.status != "ok" or not isinstance(noise, dict):
            continue
        said = (noise_text(noise), advice_text(r, noise)) if _noise(r) else \
            ("—", noise.get("reason") or "not measured")
        rows.append([_label(r), str(r.workers), str(noise.get("global_batch")), *said])
    return rows


def trace_rows(records: list[RunRecord], out_dir: Path | None
               ) -> list[tuple[str, str, list[tuple[int, str]], str]]:
    """Per profiled run: its label, the window, (rank, link) for every trace, and the note.
    Links are relative to the report's folder, so that the pages move together."""
    rows = []
    for r in records:
        profile = r.get("profile")
        if not isinstance(profile, dict) or not isinstance(profile.get("traces"), list):
            continue
        links = []
        for name in profile["traces"]:
            found = TRACE_NAME.fullmatch(name) if isinstance(name, str) else None
            if found is None:
                continue
            target = r.path.parent / name
            href = os.path.relpath(target, out_dir) if out_dir else target.as_posix()
            links.append((int(found.group(1)), Path(href).as_posix()))
        steps = profile.get("steps")
        window = f"{steps[0]}-{steps[1]}" if isinstance(steps, list) and len(steps) == 2 else "?"
        rows.append((_label(r), window, links, str(profile.get("note") or "")))
    return rows
