"""What else used the CPUs while this run trained: each rank's part of :mod:`runtime.machine`.

The window is training only (first step to the end of the last epoch's evaluation), never
start-up, plus each epoch's steps on their own. On each host the rank with local rank 0 (the
*reader*) reads the machine's CPU counters; every rank reads its own CPU time (children
included), and the reader adds the launcher's, so "own" is the whole job. Epoch readings ride on
the epoch's existing ``all_gather`` (a few floats per rank, keyed by a hash of the host name) and
the window's ends on the record's final gather: measuring adds no collective. Walking every
process (``top_others``) happens only at the window's two ends, on the readers; the job's own
processes (every rank, their children, the launcher) are left out on rank 0, which knows them
all once the record's gather is in.
"""
from __future__ import annotations

import math
import os
import zlib
from collections import defaultdict

from parascale.runtime import machine
from parascale.runtime.machine import CpuCounters

METHOD = ("machine-wide CPU time (psutil.cpu_times: busy and steal) read by local rank 0 of "
          "each host at the first step and after the last evaluation, minus the CPU time of the "
          "job's own processes (every rank, their children, the launcher); other_cores and "
          "steal_cores are CPU-seconds per second of that window, the maximum over hosts")
NO_COUNTERS = (math.nan,) * 3


class CpuWatch:
    """One rank's readings. Every rank calls every method at the same points of the run."""

    def __init__(self, host: str, local_rank: int):
        self.host, self.local_rank = host, local_rank
        self.reader = local_rank == 0
        self.key = float(zlib.crc32(host.encode()))  # exact in a float64: groups ranks by host
        self._own_cpu = machine.OwnCpu()
        self._launcher = machine.ProcessCpu(os.getppid())

    def _own(self) -> float:
        own = self._own_cpu()
        if not self.reader:
            return own
        if self._launcher.pid != os.getppid():  # the launcher died: this rank was re-parented
            self._launcher = machine.ProcessCpu(os.getppid())
        return own + self._launcher()

    def _counters(self) -> tuple[float, float, float]:
        if not self.reader:
            return NO_COUNTERS
        c = machine.counters()
        return (c.at, c.busy_s, c.steal_s)

    def start_epoch(self) -> None:
        self._epoch = (self._own(), self._counters())

    def end_epoch(self) -> list[float]:
        """This rank's share of the epoch: [host key, own CPU-s, counters at start, at end]."""
        own, start = self._epoch
        return [self.key, self._own() - own, *start, *self._counters()]

    def start_window(self) -> None:
        self._window = (self._own(), self._counters())
        if self.reader:
            self._procs = machine.process_times()
            self._load = machine.load_avg_1m()

    def end_window(self) -> dict:
        """This rank's share of the whole window, for the record's gather."""
        own, start = self._window
        end = {"host": self.host, "local_rank": self.local_rank,
               "own_s": self._own() - own, "pids": sorted(machine.family_pids())}
        if self.reader:
            b = machine.counters()
            a = CpuCounters(*start)
            after = machine.process_times()
            end.update(a=a, b=b, cores=machine.cores(),
                       load_avg_1m=[self._load, machine.load_avg_1m()],
                       # every process that used CPU: rank 0 leaves the job's own out
                       used=machine.top_others(self._procs, after, b.at - a.at, n=len(after)))
        return end


def epoch_load(readings: list[list[float]]) -> tuple[float, float]:
    """(other cores, steal cores) of one epoch, the maximum over hosts, from every rank's
    ``end_epoch`` reading."""
    by_host: dict[float, list[list[float]]] = defaultdict(list)
    for reading in readings:
        by_host[reading[0]].append(reading)
    other = steal = 0.0
    for rows in by_host.values():
        reader = next((r for r in rows if not math.isnan(r[2])), None)
        if reader is None:
            continue
        load = machine.load(CpuCounters(*reader[2:5]), CpuCounters(*reader[5:8]),
                            sum(r[1] for r in rows))
        other, steal = max(other, load["other_cores"]), max(steal, load["steal_cores"])
    return other, steal


def machine_section(ends: list[dict]) -> dict | None:
    """The record's ``machine`` section from every rank's ``end_window`` (docs/record.md);
    None if no host had a local rank 0 to read its counters."""
    by_host: dict[str, list[dict]] = defaultdict(list)
    for end in ends:
        by_host[end["host"]].append(end)
    hosts = []
    for host, ranks in by_host.items():
        reader = next((r for r in ranks if "a" in r), None)
        if reader is None:
            continue
        load = machine.load(reader["a"], reader["b"], sum(r["own_s"] for r in ranks))
        job = {pid for r in ranks for pid in r["pids"]}
        others = [p for p in reader["used"] if p["pid"] not in job]
        hosts.append({"host": host, "cores": reader["cores"], "window_s": load["seconds"],
                      "busy_cores": load["busy_cores"], "own_cores": load["own_cores"],
                      "other_cores": load["other_cores"], "steal_cores": load["steal_cores"],
                      "busy": machine.is_busy(load["other_cores"], load["steal_cores"],
                                              reader["cores"]),
                      "load_avg_1m": reader["load_avg_1m"],
                      # the rest of other_cores came from processes too short-lived to see
                      "seen_cores": sum(p["cores"] for p in others),
                      "top_others": others[:machine.TOP_OTHERS]})
    if not hosts:
        return None
    cores = max(h["cores"] for h in hosts)
    return {"cores": cores, "window_s": max(h["window_s"] for h in hosts),
            "other_cores": max(h["other_cores"] for h in hosts),
            "steal_cores": max(h["steal_cores"] for h in hosts),
            "busy": any(h["busy"] for h in hosts),
            "busy_threshold_cores": machine.busy_threshold(cores),
            "hosts": hosts, "method": METHOD}
