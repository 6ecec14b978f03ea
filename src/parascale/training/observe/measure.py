"""Step timing split into phases, and statistics with their names right.

Each step is cut at five boundaries: batch ready, compute done, synchronisation done, optimizer
done, after-step work done. "Compute done" is the moment backward ended, or the earlier moment
the strategy names (DDP: its last gradient bucket was ready; what follows is exposed
synchronisation). After-step work (local SGD's parameter averaging) is counted as "sync".
On the CPU the clock is ``perf_counter``; on CUDA the boundaries after the batch are CUDA
events, read once per epoch, so timing adds no synchronisation to the step it measures (waiting
on the device every step would serialise the very overlap we want to see).
"""
from __future__ import annotations

import time
from statistics import median
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from parascale.runrecord import EpochEntry

PHASES = ("data", "compute", "sync", "optimizer")


class StepClock:
    """Phase times of one rank's steps: ``rows`` holds [data, compute, sync, optimizer, step]."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.rows: list[list[float]] = []
        self._pending: list[tuple[float, list]] = []
        self._spare: list = []  # CUDA events already read, recorded again by later steps

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def mark(self) -> None:
        """End of the data phase; device phases start here (on the CPU, at the same stamp)."""
        now = time.perf_counter()
        self._data = now - self._t0
        self._events = [self._event()] if self.cuda else [now]

    def boundary(self, at=None) -> None:
        """A phase ends now, or ``at`` (a perf_counter value, or a CUDA event on CUDA)."""
        if at is None:
            at = self._event() if self.cuda else time.perf_counter()
        self._events.append(at)

    def stop(self) -> None:
        self.boundary()
        self._pending.append((self._data, self._events))

    def _event(self):
        event = self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def flush(self) -> None:
        """Resolve the epoch's steps into rows (on CUDA this waits for the device once)."""
        if self.cuda and self._pending:
            self._pending[-1][1][-1].synchronize()
        for data, events in self._pending:
            if self.cuda:
                compute, sync, optimizer, after = [a.elapsed_time(b) / 1000
                                                   for a, b in zip(events, events[1:])]
                self._spare.extend(events)  # read: free for the next steps' stamps
            else:  # unpacked, not zipped: this runs for every step of the epoch
                t0, t1, t2, t3, t4 = events
                compute, sync, optimizer, after = t1 - t0, t2 - t1, t3 - t2, t4 - t3
            self.rows.append([data, compute, sync + after, optimizer,
                              data + (compute + sync + optimizer + after)])
        self._pending = []

    def restart(self) -> list[list[float]]:
        """The rows so far, and a clock with none (nor steps pending): epochs are kept apart,
        since the first one's steps are the warm-up."""
        rows, self.rows, self._pending = self.rows, [], []
        return rows


class LossTally:
    """This rank's sum of the epoch's training losses, each times its batch's samples.

    The step only keeps its loss (no arithmetic, no copy to the host: on a small model the
    three tensor operations a running sum takes are a visible share of the step); ``total``
    adds them up when asked, in step order and in float64: bit for bit the running sum.
    """

    def __init__(self, device: torch.device, start: torch.Tensor | None = None):
        self.device = device
        self._sum = 0.0 if start is None else float(start)
        self._losses: list[torch.Tensor] = []
        self._samples: list[int] = []

    def add(self, loss: torch.Tensor, samples: int) -> None:
        self._losses.append(loss.detach())
        self._samples.append(samples)

    def extend(self, losses: list[torch.Tensor], samples: int) -> None:
        """Losses kept elsewhere (detached), each of a batch of ``samples``, in step order."""
        self._losses.extend(losses)
        self._samples.extend([samples] * len(losses))

    def total(self) -> torch.Tensor:
        """The sum so far, as a float64 scalar on the device."""
        if self._losses:
            # one copy to the host; each float64 product and sum in Python is the one the
            # tensors would make (IEEE), one at a time: the running sum's rounding
            for value, samples in zip(torch.stack(self._losses).double().tolist(),
                                      self._samples):
                self._sum += value * samples
            self._losses, self._samples = [], []
        return torch.tensor(self._sum, dtype=torch.float64, device=self.device)


def stats(values) -> dict[str, float] | None:
    """p50, p95, max and mean in seconds; None when there is nothing to summarise."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return None
    return {"p50": float(np.percentile(array, 50)), "p95": float(np.percentile(array, 95)),
            "max": float(array.max()), "mean": float(array.mean())}


def step_summary(rows_per_rank: list[list[list[float]]], excluded: str) -> dict:
    """The record's ``steps`` section from every rank's rows (warm-up already left out)."""
    all_rows = [row for rows in rows_per_rank for row in rows]
    table = np.asarray(all_rows, dtype=float).reshape(-1, len(PHASES) + 1)
    phases = {name: stats(table[:, i]) for i, name in enumerate(("data",) + PHASES[1:])}
    phases["step"] = stats(table[:, -1])
    per_rank = []
    for rank, rows in enumerate(rows_per_rank):
        steps = [row[-1] for row in rows]
        summary = stats(steps)
        # work (step − sync) apart per rank: a rank steadily slower than the others makes
        # them all wait, which no pooled figure shows
        work = [row[-1] - row[2] for row in rows]
        per_rank.append({"rank": rank, "steps": len(steps),
                         "step_p50_s": summary and summary["p50"],
                         "step_p95_s": summary and summary["p95"],
                         "work_mean_s": float(np.mean(work)) if work else None})
    return {"count": len(all_rows), "excluded": excluded, "phases": phases,
            "per_rank": per_rank, "work": work_summary(rows_per_rank)}


WORK_LEVELS = 41  # quantiles at 0, 2.5, ..., 100 %: 41 numbers whatever the run's length


def work_summary(rows_per_rank: list[list[list[float]]]) -> dict | None:
    """Each step's work outside the exchange (step − sync), pooled over the ranks: its mean,
    standard deviation and quantiles, enough for predict's wait for the slowest of N
    (E[max of N] − mean needs the distribution's shape, which p50/p95 alone do not give);
    and, with 2+ ranks that ran the same steps, the wait measured: per step, the slowest
    rank's work minus each rank's own, averaged (the part of the sync phase spent waiting
    rather than exchanging). None without steps."""
    work = [[row[-1] - row[2] for row in rows] for rows in rows_per_rank]
    pooled = np.asarray([w for ws in work for w in ws], dtype=float)
    if pooled.size == 0:
        return None
    levels = np.linspace(0, 100, WORK_LEVELS)
    lengths = {len(ws) for ws in work}
    wait = None
    if len(work) > 1 and len(lengths) == 1:  # the same steps on every rank: compare them
        table = np.asarray(work, dtype=float)
        wait = float((table.max(axis=0) - table).mean())
    return {"mean": float(pooled.mean()), "std": float(pooled.std()),
            "quantiles": [float(q) for q in np.percentile(pooled, levels)],
            "wait_s": wait}


def steady_figures(epochs: list[EpochEntry], rows_per_rank: list[list[list[float]]], steps_source: str,
                   steps_per_epoch: int, global_batch: int) -> dict:
    """The summary's steady epoch time and throughput, and where they come from.

    The median of the full epochs after the warm-up; a partial epoch is never passed off as an
    epoch. Without a full steady epoch (one epoch, or a partial second one) the slowest rank's
    mean steady step time stands in, times the steps of a full epoch (``steps_source`` says
    which steps). The mean, not the median: an epoch's time is a sum of steps.
    """
    # an epoch the profiler slowed (--profile) is no steady figure either
    full = [e for e in epochs if not e.warmup and not e.partial and not e.profiled]
    if full:
        numbers = [e.epoch for e in full]
        return {"steady_epoch_time_s": median(e.wall_time_s for e in full),
                "steady_throughput": median(cast(float, e.throughput) for e in full),
                "steady_epoch_time_method": "epochs",
                "steady_source": epochs_named(numbers)}
    step_s = max(float(np.mean([row[-1] for row in rows])) for rows in rows_per_rank if rows)
    return {"steady_epoch_time_s": step_s * steps_per_epoch,
            "steady_throughput": global_batch / step_s,
            "steady_epoch_time_method": "steps", "steady_source": steps_source}


def epochs_named(numbers: list[int]) -> str:
    """'epoch 3' or 'epochs 2, 4-9' for the ascending epoch ``numbers``."""
    return ("epoch " if len(numbers) == 1 else "epochs ") + spans(numbers)


def spans(numbers: list[int]) -> str:
    """'2-9, 11-40' for the ascending ``numbers`` (a resumed run's warm-up epoch leaves a gap)."""
    parts, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(str(n) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def peak_memory(device: torch.device) -> tuple[str, int, int | None]:
    """(kind, bytes, reserved): CUDA allocator peak and the most it reserved, or the process's
    maximum resident set on the CPU (nothing reserved apart)."""
    if device.type == "cuda":
        return ("cuda_max_allocated", int(torch.cuda.max_memory_allocated(device)),
                int(torch.cuda.max_memory_reserved(device)))
    import resource

    return "cpu_max_rss", int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, None
