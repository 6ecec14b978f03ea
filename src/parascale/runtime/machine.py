"""What else used the CPUs while a run ran: contention measured from the kernel, not guessed.

On a shared machine a throughput figure means little without knowing whether other programs
competed for the cores. Over a window (a run, an epoch, a pause between runs) we read the
machine-wide CPU counters (``psutil.cpu_times``: the kernel's busy, idle and steal time summed
over all CPUs) at both ends, and the CPU time of the run's own processes over the same window.
What the machine spent beyond the run's own processes is the *other* load; the hypervisor's
steal time is what other guests took. Both are averages in cores (CPU-seconds per second), so
"0.95 other cores" on a 2-core machine means another program held about one core throughout.

A window counts as busy when other + steal reaches ``busy_threshold(cores)``: a tenth of the
machine, and never less than a quarter of a core (below that, the counters' own jitter and the
launcher's polling are of the same order).

Processes are named only from their CPU time at the window's two ends, so a process that
started or ended within it is never seen: a build's compilers, a test suite's interpreters.
What the processes seen at both ends used (``seen_cores``) is kept beside the other load, and
:func:`others_text` says how much of that load none of them explains, rather than calling the
largest of them, perhaps a few hundredths of a core, the cause.
"""
from __future__ import annotations

import os
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import psutil

BUSY_SHARE = 0.10  # of all cores
BUSY_MIN_CORES = 0.25
TOP_OTHERS = 3  # how many other processes a record names


@dataclass(frozen=True)
class CpuCounters:
    """Machine-wide CPU time at one moment, in CPU-seconds summed over all CPUs."""

    at: float  # time.monotonic()
    busy_s: float  # user, nice, system, irq, softirq (not idle, iowait or steal)
    steal_s: float  # time the hypervisor gave to other guests


#: the kernel's clock ticks per second, the unit of /proc/stat and /proc/PID/stat
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_proc(path: str) -> bytes | None:
    """The start of a /proc file, read with three system calls; None where there is none (not
    Linux; a process gone). psutil parses the same files at three times the cost, and a
    recording run reads them four times an epoch: on a short epoch that was a visible share."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def counters() -> CpuCounters:
    stat = _read_proc("/proc/stat")
    if stat is not None and stat.startswith(b"cpu "):
        # user nice system idle iowait irq softirq steal: what psutil.cpu_times reads
        ticks = [int(x) for x in stat.split(b"\n", 1)[0].split()[1:9]] + [0] * 8
        user, nice, system, _, _, irq, softirq, steal = ticks[:8]
        return CpuCounters(time.monotonic(), (user + nice + system + irq + softirq) / _HZ,
                           steal / _HZ)
    t = psutil.cpu_times()
    busy = t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) \
        + getattr(t, "softirq", 0.0)
    return CpuCounters(time.monotonic(), busy, getattr(t, "steal", 0.0))


def cores() -> int:
    """CPUs the machine has online (not only the ones this process may use)."""
    return psutil.cpu_count(logical=True) or os.cpu_count() or 1


class OwnCpu:
    """CPU-seconds used so far by this process, its live descendants and its reaped children.

    Descendants are the parameter servers and data-loader workers a rank starts; reaped children
    (an epoch's finished loader workers) are only visible through getrusage. Finding the live
    descendants walks /proc, reading every process's stat (milliseconds on a busy machine, read
    twice an epoch), so the walk is made at most once every ``refresh_s`` and the processes it
    found are read directly in between. One started since the last walk is counted from the
    next walk on, with all its CPU so far: a window's total stays whole, and only the epoch it
    is counted in can be late by ``refresh_s``.
    """

    def __init__(self, refresh_s: float = 1.0):
        self.refresh_s = refresh_s
        self._walked_at = -float("inf")
        self._known: list[psutil.Process] = []

    def __call__(self) -> float:
        import resource

        now = time.monotonic()
        if now - self._walked_at >= self.refresh_s:
            self._known, self._walked_at = descendants(), now
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        # this process from the kernel's per-process clock (all threads; a system call, where
        # psutil parses /proc/self/stat, in ticks, at ten times the cost: read twice an epoch)
        return (time.process_time() + sum(_cpu(child) for child in self._known)
                + usage.ru_utime + usage.ru_stime)


class ProcessCpu:
    """CPU-seconds used so far by one process alone (0 once it is gone): the launcher's share
    of a rank's epoch, read from /proc directly where there is one."""

    def __init__(self, pid: int):
        self.pid, self._stat = pid, f"/proc/{pid}/stat"
        self._proc: psutil.Process | None = None
        if not os.path.exists(self._stat):  # not Linux (or gone: then 0 either way)
            try:
                self._proc = psutil.Process(pid)
            except psutil.Error:
                pass

    def __call__(self) -> float:
        if self._proc is not None:
            return _cpu(self._proc)
        stat = _read_proc(self._stat)
        if stat is None:
            return 0.0
        # utime and stime, the 14th and 15th fields, counted after the name's closing bracket
        # (a name may hold spaces and brackets of its own)
        utime, stime = stat[stat.rindex(b")") + 2:].split()[11:13]
        return (int(utime) + int(stime)) / _HZ


def family_pids() -> set[int]:
    """This process, its parent and its live descendants. For a rank: itself, its launcher and
    what it started (servers, loader workers), none of which is "another program"."""
    me = psutil.Process()
    return {me.pid, me.ppid()} | {child.pid for child in descendants()}


def load_avg_1m() -> float:
    """The kernel's one-minute load average: runnable processes, a coarse second opinion."""
    return psutil.getloadavg()[0]


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """The live descendants of ``pid`` (this process when None); none when it is gone."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _cpu(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:  # gone meanwhile: its time is lost, which errs towards "other"
        return 0.0


def busy_threshold(n_cores: int) -> float:
    """Other + steal load, in cores, from which a window counts as busy."""
    return max(BUSY_MIN_CORES, BUSY_SHARE * n_cores)


def is_busy(other_cores: float, steal_cores: float, n_cores: int) -> bool:
    return other_cores + steal_cores >= busy_threshold(n_cores)


def load(a: CpuCounters, b: CpuCounters, own_s: float) -> dict[str, float]:
    """Average cores over the window a..b: machine busy, own (from ``own_s`` CPU-seconds of the
    run's processes in the window), other = busy - own (never below 0), and steal."""
    seconds = max(b.at - a.at, 1e-9)
    busy = max(0.0, b.busy_s - a.busy_s) / seconds
    own = max(0.0, own_s) / seconds
    return {"seconds": seconds, "busy_cores": busy, "own_cores": own,
            "other_cores": max(0.0, busy - own),
            "steal_cores": max(0.0, b.steal_s - a.steal_s) / seconds}


def process_times(exclude: AbstractSet[int] = frozenset()) -> dict[int, tuple[float, str]]:
    """CPU-seconds so far and a short description of every process but ``exclude``."""
    found = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline", "cpu_times"]):
        info = proc.info
        if info["pid"] in exclude or info["cpu_times"] is None:
            continue
        cmd = " ".join(info["cmdline"] or []) or info["name"] or "?"
        found[info["pid"]] = (info["cpu_times"].user + info["cpu_times"].system, cmd[:120])
    return found


def top_others(before: dict[int, tuple[float, str]], after: dict[int, tuple[float, str]],
               seconds: float, n: int = TOP_OTHERS) -> list[dict]:
    """The processes (present at both ends) that used the most CPU in between, in cores."""
    used = [(after[pid][0] - before[pid][0], pid, after[pid][1]) for pid in after if pid in before]
    used.sort(reverse=True)
    return [{"pid": pid, "command": cmd, "cores": cpu / max(seconds, 1e-9)}
            for cpu, pid, cmd in used[:n] if cpu > 0]


def others_text(load: dict) -> str:
    """Who used the other cores of ``load`` (a record's host entry or a quiet-machine sample:
    ``other_cores``, ``top_others`` and, where recorded, ``seen_cores``): the largest process
    seen, and the cores that no process seen at both ends of the window explains."""
    top = load.get("top_others") or []
    if top:
        command = " ".join(str(top[0].get("command", "?")).split())[:60]  # one line
        text = (f"the largest process seen throughout: {command} (pid {top[0].get('pid')}, "
                f"{top[0].get('cores', 0.0):.2f} cores)")
    else:
        text = "no process seen throughout used CPU"
    seen = load.get("seen_cores")
    if seen is None:  # a record from before seen_cores: the rest cannot be told
        return text if top else "no single process stood out"
    unnamed = max(0.0, load.get("other_cores", 0.0) - seen)
    if round(unnamed, 2) > 0:
        text += f"; {unnamed:.2f} cores came from processes too short-lived to name"
    return text


def sample_other_cores(seconds: float) -> dict[str, float]:
    """Load on the machine beyond this process over the next ``seconds``: what a study checks
    between runs before it trusts the machine to be quiet. Between runs a study has no children
    of its own, so a child still running then (a leftover worker, anything the caller started)
    is load like any other."""
    me = os.getpid()
    own = ProcessCpu(me)
    own0, a = own(), counters()
    time.sleep(seconds)
    b, own1 = counters(), own()
    return load(a, b, own1 - own0)
