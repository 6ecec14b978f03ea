"""Probes of the batch search under a strategy's memory layout (``find-batch --sync zero|fsdp``).

A sharded strategy's memory per device depends on the other devices holding the rest of the
state, so one process cannot stand in for it: each probe is a real training job of two steps
on the search's workers with that strategy (``parascale.train``, so the sharding is the
trainer's own), and its record says whether it fitted: status ``oom`` on a GPU, or on the CPU
the largest rank's peak resident set against the per-worker budget.

On the CPU the workers are told to map every large buffer on its own
(``MALLOC_MMAP_THRESHOLD_``): glibc otherwise keeps in its heap the gathered parameters and
reduce-scatter buffers FSDP frees every step, so the resident peak measures glibc's heap
rather than what the strategy holds (FSDP stage 2 peaked 3x above what it held in
benchmarks/RESULTS-sharded.md, 7 % above the memory model with the threshold set).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator

from parascale.batchfind import Probe
from parascale.errors import KnownFailure

#: glibc maps allocations above this many bytes on their own and unmaps them when freed
MMAP_THRESHOLD = 131072
STEPS = 2  # the second holds the optimizer's state too, as a single-process probe's does


def probe_by_training(cfg, workers: int, budget: int | None) -> Callable[[int], Probe]:
    """A ``try_batch`` that trains ``cfg`` (its model or task, data, strategy and GPUs) for two
    steps at each per-device batch on ``workers`` processes."""
    from parascale.training import train

    def try_batch(batch: int) -> Probe:
        job = cfg.replace(workers=None if cfg.processes.gpus else workers, batch_size=batch,
                          global_batch=None, steps=STEPS, epochs=None, noise_scale=False,
                          save_model=False, out=None, val_fraction=0.0, evaluate_test=True)
        with _quiet(), _mapped(cfg.processes.gpus is None):
            record = train(job)
        status = record.get("status")
        peaks = [p for p in (record.get("memory") or {}).get("peak_bytes_per_rank") or []
                 if p is not None]
        peak = max(peaks) if peaks else None
        if status == "oom":
            return Probe(batch, False, peak, f"out of memory: {record.get('reason', '')}")
        if status != "ok":  # not a memory answer: the search cannot go on
            raise KnownFailure(f"the probe of batch {batch} on {workers} workers failed: "
                               f"{record.get('reason', status)}")
        if budget is not None and peak is not None and peak > budget:
            return Probe(batch, False, peak,
                         f"peak {peak:,} bytes is over the budget of {budget:,}")
        return Probe(batch, True, peak)

    return try_batch


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The trainer's progress lines (its own and its workers', on file descriptor 1) are not
    the search's, which prints one line per probe; errors still reach stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            with contextlib.redirect_stdout(io.StringIO()):
                yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _mapped(cpu: bool) -> Iterator[None]:
    """MALLOC_MMAP_THRESHOLD_ for the workers started inside (runtime/processes.py applies it
    in a forked worker as glibc does in a fresh one), unless the caller set it already."""
    if not cpu or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        yield
        return
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    try:
        yield
    finally:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
