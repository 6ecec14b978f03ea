"""The prediction as text (terminal), CSV and JSON. Pure: strings in, nothing written here."""
from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING

from parascale.predict import utilisation

if TYPE_CHECKING:
    from parascale.predict.prediction import Prediction

SCHEMA = "parascale.prediction/1"
CSV_FIELDS = ("mode", "workers", "per_device_batch", "global_batch", "work_s", "wait_s",
              "comm_s", "exposed_s", "step_s", "throughput", "speedup", "efficiency",
              "steps_factor", "tta_speedup", "mfu")


def _ms(seconds: float) -> str:
    # whole milliseconds up to seven digits, then 1.2e+30 rather than thirty digits
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 1e4 or ms >= 1e7 else f"{ms:.0f}"


def _batch(b: float) -> str:
    return f"{b:g}" if b == int(b) else f"{b:.1f}"


def format_prediction(pred: Prediction) -> str:
    lines = [f"Prediction for {pred.subject}", "", "Inputs (how each is known):"]
    lines += [f"  {i.line()}" for i in pred.model.inputs]
    if pred.flops:
        lines += [f"  {line}" for line in utilisation.input_lines(pred.flops)]
    for mode, points in pred.curves.items():
        if not points:
            continue
        noise = points[0].steps_factor is not None
        lines += ["", f"{mode} scaling ({_mode_words(mode, points)}):",
                  f"{'N':>6}{'b/dev':>8}{'compute ms':>12}{'wait ms':>9}{'exposed ms':>12}"
                  f"{'comm ms':>10}"
                  f"{'step ms':>10}{'samples/s':>12}{'speedup':>9}{'eff.':>8}"
                  + (f"{'steps x':>9}{'TTA speedup':>13}" if noise else "")
                  + (f"{'MFU':>8}" if pred.flops else "")]
        for p in points:
            line = (f"{p.workers:>6}{_batch(p.per_device_batch):>8}{_ms(p.work_s):>12}"
                    f"{_ms(p.wait_s):>9}{_ms(p.exposed_s):>12}{_ms(p.comm_s):>10}"
                    f"{_ms(p.step_s):>10}"
                    f"{p.throughput:>12.4g}{p.speedup:>9.3g}{p.efficiency:>8.1%}")
            if noise:
                line += f"{p.steps_factor:>9.3g}{p.tta_speedup:>13.3g}"
            if pred.flops:
                line += f"{utilisation.mfu(p.throughput, p.workers, pred.flops):>8.1%}"
            lines.append(line)
    lines += ["", "compute: data + forward + backward + optimizer (no exchange); wait: for the "
              "slowest device; comm: the exchange's modelled time per step; exposed: what of it "
              "the step waits for; efficiency = speedup / N, never capped."]
    if pred.checks:
        lines += ["", "Measured in the study at the same N and batch (efficiency relative to "
                  + ("1 worker" if all(c.reference_workers == 1 for c in pred.checks)
                     else "the smallest N measured") + "):",
                  f"{'mode':>8}{'N':>5}{'b/dev':>7}{'runs':>6}{'measured':>10}{'predicted':>11}"
                  f"{'error':>10}"]
        for c in pred.checks:
            lines.append(f"{c.mode:>8}{c.workers:>5}{c.per_device_batch:>7}{c.runs:>6}"
                         f"{c.measured_efficiency:>10.1%}{c.predicted_efficiency:>11.1%}"
                         f"{c.error_pp:>+8.1f}pp" + ("  (busy machine)" if c.busy else ""))
    lines += [f"note: {note}" for note in pred.notes]
    return "\n".join(lines)


def _mode_words(mode: str, points) -> str:
    if mode == "weak":
        return f"per-device batch {_batch(points[0].per_device_batch)} fixed, E = t1/tN"
    return f"global batch {_batch(points[0].global_batch)} fixed, E = t1/(N·tN)"


def to_csv(pred: Prediction) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for points in pred.curves.values():
        for p in points:
            writer.writerow({**{k: v for k, v in p.to_dict().items() if k in CSV_FIELDS},
                             "mfu": utilisation.mfu(p.throughput, p.workers, pred.flops)
                             if pred.flops else None})
    return buffer.getvalue()


def to_json(pred: Prediction) -> str:
    data = {
        "schema": SCHEMA,
        "subject": pred.subject,
        "sources": pred.sources,
        "inputs": [{"name": i.name, "value": i.value, "unit": i.unit, "how": i.how,
                    "source": i.source} for i in pred.model.inputs],
        "model": {"strategy": pred.model.strategy.name,
                  "gradient_bytes": pred.model.gradient_bytes,
                  "overlap": pred.model.overlap, "messages": pred.model.buckets,
                  "step_spread_s": pred.model.spread_s,
                  "work": {"per_sample_s": pred.model.work.per_sample_s,
                           "fixed_s": pred.model.work.fixed_s,
                           "other_s": pred.model.work.other_s},
                  "link": pred.model.link.to_dict(),
                  "intra_link": pred.model.intra.to_dict() if pred.model.intra else None,
                  "gpus_per_node": pred.model.per_node,
                  "noise_scale": pred.model.noise_scale},
        "curves": {mode: [p.to_dict() for p in points] for mode, points in pred.curves.items()},
        "flops": pred.flops,
        "mfu": {mode: [utilisation.mfu(p.throughput, p.workers, pred.flops) for p in points]
                for mode, points in pred.curves.items()} if pred.flops else None,
        "measured": [c.to_dict() for c in pred.checks],
        "notes": pred.notes,
    }
    # never Infinity or NaN (not JSON): predict refuses what would lead to them
    return json.dumps(data, indent=2, allow_nan=False) + "\n"
