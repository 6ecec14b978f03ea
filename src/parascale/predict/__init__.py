"""``parascale predict``: a calibrated cost model of data-parallel scaling.

From run records (compute time per step at a per-device batch, the gradient's bytes, the
exposed sync of runs that overlapped) and an interconnect (α, β fitted to a ``parascale comm``
record, or a named preset), predict the step time on N = 1 … thousands of devices, split into
work and exposed communication, with throughput, speedup and efficiency, under weak and strong
scaling. Every figure the prediction rests on is listed with how it is known (measured, fitted,
counted, given or assumed). Nothing here starts a process; everything but :func:`write` is pure.

Modules: ``forecast`` (the options, the steps of a prediction and its files), ``limits`` (the
ranges every input must lie in), ``interconnect`` (presets and the α-β fit), ``costs``
(per-strategy exchange time), ``model`` (step-time composition), ``calibrate`` (records to
model), ``gradient`` (the bytes a step exchanges), ``compare`` (measured points beside the
prediction), ``prediction`` (what a prediction holds), ``table`` and ``plot``. The formulas and
design notes are in docs/predict.md.
"""
from parascale.predict.forecast import (DEFAULT_WORKERS, NAMES, Options, predict, read_comm,
                                        validate, write)
from parascale.predict.prediction import Prediction

__all__ = ["DEFAULT_WORKERS", "NAMES", "Options", "Prediction", "predict", "read_comm",
           "validate", "write"]
