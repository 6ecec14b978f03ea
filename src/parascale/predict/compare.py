"""The study's own measurements beside the prediction at the same N and per-device batch.

Measured rows come from the report's :func:`~parascale.report.rows.summary_rows` (medians over
repeats, efficiency relative to the 1-worker run, or to the smallest N measured), so predict and
report agree on what was measured by construction. The error is in percentage points of
efficiency: predicted − measured.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from parascale.predict.model import Model
from parascale.report.load import RunRecord
from parascale.report.rows import summary_rows


@dataclass(frozen=True)
class Check:
    mode: str
    workers: int
    per_device_batch: int
    runs: int
    reference_workers: int
    measured_throughput: float
    predicted_throughput: float
    measured_efficiency: float
    predicted_efficiency: float
    busy: bool
    """A run of the row ran on a busy machine (its record's ``machine.busy``)."""

    @property
    def error_pp(self) -> float:
        return 100 * (self.predicted_efficiency - self.measured_efficiency)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error_pp": self.error_pp}


def checks(records: list[RunRecord], model: Model) -> list[Check]:
    """One per measured worker count of the predicted strategy that has an efficiency."""
    found = []
    for row in summary_rows(records):
        if row.key.sync != model.strategy.name or row.efficiency is None \
                or row.per_device_batch is None:
            continue
        mode = row.mode if row.mode in ("weak", "strong") else "weak"
        b = row.per_device_batch
        ref_n = row.reference_workers
        # the reference batch of this row's group: weak keeps b, strong keeps N_ref * b_ref
        ref_b = b if mode == "weak" else (row.global_batch or b * row.workers) / ref_n
        one = b if mode == "weak" else ref_b * ref_n  # what one device runs in this mode
        at_n = model.point(mode, row.workers, b, one)
        at_ref = model.point(mode, ref_n, ref_b, one)
        # E = N_ref·X_N / (N·X_ref), which is X_N / (N·X_1) when the reference is one worker
        efficiency = ref_n * at_n.throughput / (row.workers * at_ref.throughput)
        found.append(Check(mode, row.workers, b, row.runs, ref_n, row.throughput,
                           at_n.throughput, row.efficiency, efficiency, bool(row.busy)))
    return found
