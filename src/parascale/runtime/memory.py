"""Telling a worker killed for lack of memory from one killed for another reason, on a CPU.

On a GPU an out-of-memory is an exception the worker reports. On a CPU the kernel's
out-of-memory killer ends the process with SIGKILL, and a SIGKILL alone says nothing of why. The
launcher gathers the evidence there is: the memory cgroup's count of out-of-memory kills
(``oom_kill`` in ``memory.events`` on cgroup v2, ``memory.oom_control`` on v1), which rises when
the kernel killed a process of the job's cgroup, and each worker's largest resident set seen
while it ran against the memory it could have (the cgroup's limit, else the machine's).
"""
from __future__ import annotations

from pathlib import Path

import psutil

CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory")
NEAR_LIMIT = 0.8  # a killed worker this close to the limit counts as out of memory
_UNLIMITED = 1 << 60  # cgroup v1 writes a huge number for "no limit"


def _cgroup_files(name_v2: str, name_v1: str) -> list[Path]:
    """This process's memory cgroup files, v2 then v1, that exist."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # the v2 hierarchy
            found += [Path(root + path.rstrip("/")) / name_v2 for root in CGROUP_ROOTS[:2]]
        elif "memory" in controllers.split(","):
            found.append(Path(CGROUP_ROOTS[2] + path.rstrip("/")) / name_v1)
    return [f for f in found if f.is_file()]


def oom_kills() -> int | None:
    """How many processes the kernel killed for lack of memory in this process's cgroup so
    far, or None where no cgroup says (the count is then no evidence either way)."""
    for file in _cgroup_files("memory.events", "memory.oom_control"):
        try:
            for line in file.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def limit_bytes() -> int:
    """The memory this process's cgroup may use, or the machine's when it has no limit."""
    for file in _cgroup_files("memory.max", "memory.limit_in_bytes"):
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _UNLIMITED:
            return int(text)
    return psutil.virtual_memory().total


class Peaks:
    """The largest resident set of each watched process, sampled while the launcher waits."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.bytes = [0] * len(pids)

    def sample(self) -> None:
        for i, pid in enumerate(self.pids):
            try:
                self.bytes[i] = max(self.bytes[i], psutil.Process(pid).memory_info().rss)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                pass


def killed_for_memory(kills_before: int | None, peak: int, limit: int) -> str | None:
    """The evidence that a worker killed by SIGKILL ran out of memory, as words, or None."""
    kills = oom_kills()
    evidence = []
    if kills_before is not None and kills is not None and kills > kills_before:
        evidence.append(f"the memory cgroup counted {kills - kills_before} out-of-memory "
                        f"kill(s) during the job")
    if peak >= NEAR_LIMIT * limit:
        evidence.append(f"its resident memory had reached {_gib(peak)} of the {_gib(limit)} "
                        "it could use")
    elif evidence and peak:
        evidence.append(f"its resident memory had reached {_gib(peak)} (of {_gib(limit)})")
    return "; ".join(evidence) or None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
