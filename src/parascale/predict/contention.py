"""Compute at N from a study's contention baselines (``bench --baseline``).

N processes sharing one machine slow each other's forward and backward (cores, memory
bandwidth, caches), which a 1-worker record cannot show. A baseline run is the same N
processes with the gradient exchange left out, so its measured compute per step is exactly
the compute a step at N pays. Per N with baselines: k(N) = the baseline's compute over the
reference compute at the baseline's own per-device batch (so weak and strong baselines both
count), the median over its records; the model multiplies compute(b) at N by k(N). An N
without a baseline keeps the reference compute (k = 1), as before.

Chosen against: taking the baseline's whole step (it also holds the optimizer and the rest,
which the model takes from the reference) and fitting k(N) as a curve in N (two or three
measured N say nothing about N = 4096; the model would invent the contention of a machine
it has not seen, so beyond the measured N it stays at separate devices).
"""
from __future__ import annotations

from statistics import median

from parascale.predict import calibrate
from parascale.predict.model import Input, Work
from parascale.report.load import RunRecord


def baselines(loaded: list[RunRecord], model: str, dataset: str) -> list[RunRecord]:
    """The finished baseline records of the predicted model."""
    return [r for r in loaded if r.status == "ok" and r.baseline and r.workers
            and r.model == model and r.dataset == dataset]


def factors(records: list[RunRecord], work: Work,
            reference_n: int) -> tuple[dict[int, float], list[Input]]:
    """k(N) per N above the reference's worker count, and an input naming each N's source."""
    by_n: dict[int, list[calibrate.Phases]] = {}
    for r in records:
        if r.workers > reference_n:
            by_n.setdefault(r.workers, []).append(calibrate.phases(r))
    found, inputs = {}, []
    for n, ps in sorted(by_n.items()):
        if any(work.compute(p.batch) <= 0 for p in ps):
            continue  # a reference that measured no compute has nothing to scale
        k = median(p.compute_s / work.compute(p.batch) for p in ps)
        found[n] = k
        batches = sorted({p.batch for p in ps})
        at = median(p.compute_s for p in ps)
        inputs.append(Input(f"compute at N={n}", f"{at * 1e3:.4g} ms at b="
                            f"{','.join(map(str, batches))} (x{k:.3g} the {reference_n}-worker "
                            "compute)", "", "measured",
                            f"contention baseline: {len(ps)} --baseline record(s) at N={n} (the "
                            "same processes, no exchange), data + forward + backward, mean of "
                            "steady steps"))
    if found:
        inputs.append(Input("compute at other N", "compute(b)", "", "assumed",
                            f"N without a baseline (not {','.join(map(str, found))}): the "
                            f"{reference_n}-worker compute, as on separate devices"))
    return found, inputs
