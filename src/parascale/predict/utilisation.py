"""Model-FLOPs utilisation of predicted points, from the FLOPs the records counted.

A record counts its model's FLOPs per step with torch's counter and knows one device's peak
(``flops`` section, see :mod:`parascale.flops`). Model FLOPs per sample do not depend on N, so a
predicted throughput X on N devices achieves X x FLOPs-per-sample, out of N x the peak.
"""
from __future__ import annotations

from statistics import median

from parascale.report.load import RunRecord


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def from_records(records: list[RunRecord]) -> dict | None:
    """``{"per_sample", "peak", "source", "measured"}`` (FLOPs per sample, one device's peak
    FLOP/s), medians over the records that have them; None when none counted or knew a peak."""
    per_sample, peaks, sources = [], [], []
    for r in records:
        step, batch = _number(r.get("summary", "flops_per_step")), \
            _number(r.get("derived", "global_batch"))
        total, world = _number(r.get("flops", "peak_flops")), \
            _number(r.get("derived", "world_size"))
        if step and batch and total and world:
            per_sample.append(step / batch)
            peaks.append(total / world)
            sources.append(r.get("flops", "peak_source", default="?"))
    if not per_sample:
        return None
    return {"per_sample": median(per_sample), "peak": median(peaks), "source": str(sources[0]),
            "measured": records[0].get("flops", "peak_measured") is True}


def mfu(throughput: float, workers: int, flops: dict) -> float:
    """Utilisation of ``workers`` devices at ``throughput`` samples/s."""
    return throughput * flops["per_sample"] / (workers * flops["peak"])


def input_lines(flops: dict) -> list[str]:
    """How the prediction knows the FLOPs and the peak, in the style of its other inputs."""
    how = "measured" if flops["measured"] else "given"
    return [f"model FLOPs per sample = {flops['per_sample']:.4g}  [counted] the records' "
            "torch.utils.flop_counter.FlopCounterMode",
            f"device peak = {flops['peak']:.4g} FLOP/s  [{how}] {flops['source'][:120]}"]
