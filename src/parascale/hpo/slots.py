"""The devices of each concurrent trial: disjoint sets of GPUs, or of CPU cores.

Trials are processes, never threads, and each is pinned (CPU affinity) to its own cores, which
its workers inherit; the trainer then sizes its threads from those cores, so trials do not
compete for a core. With GPUs, each trial gets its GPUs and an equal share of the cores for its
data loading. Concurrency = devices // devices per trial; left-over devices stay idle.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from parascale.errors import UsageError


@dataclass(frozen=True)
class Slot:
    cores: tuple[int, ...]
    gpus: tuple[int, ...] | None = None

    def label(self) -> str:
        if self.gpus is not None:
            return f"GPU {','.join(map(str, self.gpus))}"
        return f"core{'s' if len(self.cores) > 1 else ''} {','.join(map(str, self.cores))}"


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning, but still one trial per core
        return list(range(os.cpu_count() or 1))


def make_slots(per_trial: int, gpus: tuple[int, ...] | None = None,
               cores: list[int] | None = None) -> list[Slot]:
    """One slot per concurrent trial; each has ``per_trial`` devices."""
    cores = _cores() if cores is None else cores
    if per_trial < 1:
        raise UsageError(f"--devices-per-trial must be a positive integer, got {per_trial}")
    devices = list(gpus) if gpus else cores
    kind = "GPUs" if gpus else "CPU cores"
    if per_trial > len(devices):
        raise UsageError(f"--devices-per-trial {per_trial} is more than the {len(devices)} "
                         f"{kind} this search may use")
    count = len(devices) // per_trial
    groups = [tuple(devices[i * per_trial:(i + 1) * per_trial]) for i in range(count)]
    if not gpus:
        return [Slot(group) for group in groups]
    share = max(1, len(cores) // count)  # fewer cores than trials: they share round the list
    return [Slot(tuple(cores[(i * share + j) % len(cores)] for j in range(share)), group)
            for i, group in enumerate(groups)]
