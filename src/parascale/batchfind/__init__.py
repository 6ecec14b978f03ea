"""The largest per-device batch that fits: the search BSC did by hand ("try and error until a
memory error appears"), automated.

The batch grows geometrically (doubling) until a probe fails for memory, then the search bisects
between the last batch that fitted and the first that did not. Each probe runs real forward,
backward and optimizer steps in a child process that is then gone (:mod:`.probe`), so nothing
one probe allocated is in the next. On a GPU the signal is CUDA's out-of-memory error. On a CPU
the kernel would rather kill a process (or the machine's other programs) than raise, so the
signal is a budget: a probe whose peak resident memory exceeds it fails, and before each probe
the peak is extrapolated (a straight line through the last two that fitted: memory grows about
linearly with the batch) so that a probe predicted to exceed the budget is never started.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from parascale import safejson


@dataclass(frozen=True)
class Probe:
    """What trying one batch found: whether it fitted, its peak memory, and why not."""

    batch: int
    fits: bool
    peak_bytes: int | None = None
    reason: str = ""
    ran: bool = True  # False: predicted over the budget, never started


@dataclass
class Search:
    """The search's state and result; ``probes`` in the order they were made."""

    budget: int | None
    limit: int
    probes: list[Probe] = field(default_factory=list)

    @property
    def best(self) -> Probe | None:
        fitted = [p for p in self.probes if p.fits]
        return max(fitted, key=lambda p: p.batch) if fitted else None

    def predicted(self, batch: int) -> int | None:
        """The peak a probe of ``batch`` would reach, on the line through the last two that
        fitted (None with fewer than two)."""
        fitted = sorted((p for p in self.probes if p.fits and p.peak_bytes), key=lambda p: p.batch)
        if len(fitted) < 2:
            return None
        a, b = fitted[-2], fitted[-1]
        slope = (b.peak_bytes - a.peak_bytes) / (b.batch - a.batch)
        return int(b.peak_bytes + slope * (batch - b.batch))


def search(try_batch: Callable[[int], Probe], budget: int | None, start: int = 1,
           limit: int = 1 << 16, report: Callable[[Probe], None] | None = None) -> Search:
    """Double from ``start`` until a batch fails (or ``limit``), then bisect; ``try_batch``
    runs one probe. ``budget`` (bytes) is the CPU's: probes predicted above it are not run.
    ``report`` is told of every probe, run or not, as it is decided."""
    found = Search(budget, limit)

    def attempt(batch: int) -> bool:
        guess = found.predicted(batch) if budget is not None else None
        if guess is not None and guess > budget:
            probe = Probe(batch, False, guess, f"not run: its peak, extrapolated, would be "
                          f"{guess / (1 << 30):.2f} GiB, over the budget", ran=False)
        else:
            probe = try_batch(batch)
        found.probes.append(probe)
        if report is not None:
            report(probe)
        return probe.fits

    batch, good = min(start, limit), 0
    while True:
        if not attempt(batch):
            bad = batch
            break
        good = batch
        if batch >= limit:  # everything up to the limit fits
            return found
        batch = min(batch * 2, limit)
    while bad - good > 1:
        middle = (good + bad) // 2
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return found


def probe_in_child(task: dict, folder, timeout_s: float = 600.0) -> Callable[[int], Probe]:
    """A ``try_batch`` that runs each probe in a fresh child process (forked from the fork
    server: torch is imported once), with ``task`` (model, classes, shape, device, budget)."""
    import json
    import os
    import signal
    from pathlib import Path

    from parascale.errors import KnownFailure
    from parascale.runtime import contract, processes
    from parascale.runtime.env import available_cores

    def try_batch(batch: int) -> Probe:
        answer = Path(folder) / f"probe-{batch}.json"
        log = Path(folder) / f"probe-{batch}.log"
        env = {**os.environ, contract.PROBE: safejson.dumps(
            {**task, "batch": batch, "answer": str(answer)})}
        child = processes.start_module("parascale.batchfind.probe", env, log,
                                       available_cores(), "parascale-probe")
        code = child.wait(timeout_s)
        if code is None:
            processes.stop([child], 0.0)
            return Probe(batch, False, None, f"no answer within {timeout_s:g} s")
        if code == -signal.SIGKILL:  # the kernel's out-of-memory killer
            return Probe(batch, False, None, "the probe was killed by SIGKILL (the kernel's "
                         "out-of-memory killer, unless someone else sent it)")
        if code != 0 or not answer.is_file():  # not a memory answer: the search cannot go on
            tail = processes.tail(log, "", lines=3)
            raise KnownFailure(f"the probe of batch {batch} {processes.exit_text(code)}"
                               + (f": {tail}" if tail else ""))
        found = json.loads(answer.read_text())
        return Probe(batch, found["fits"], found.get("peak_bytes"), found.get("reason", ""))

    return try_batch
