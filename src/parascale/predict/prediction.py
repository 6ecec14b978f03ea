"""What a prediction is (``Prediction``): the calibrated model, its curves by scaling mode, the
measured points beside them, and the notes and sources it rests on; what ``forecast`` makes
and ``table`` and ``plot`` write."""
from __future__ import annotations

from dataclasses import dataclass, field

from parascale.predict.compare import Check
from parascale.predict.model import Model, Point


@dataclass
class Prediction:
    subject: str
    model: Model
    curves: dict[str, list[Point]]
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    flops: dict | None = None  # model FLOPs per sample and one device's peak (utilisation.py)
