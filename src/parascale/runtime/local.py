"""Start N worker processes on this machine, watch them, and end the job when one fails.

The launcher hosts the rendezvous TCPStore itself (:func:`.rendezvous.open_store`: listening on loopback
only, on a port the operating system chooses or the user's ``--port``) and passes that port to
the workers: no free-port guessing, so no race between choosing a port and binding it. Each
worker runs ``<module>`` as ``python -m`` would, forked from the fork server
(:mod:`.processes`), with its rank in ``PARASCALE_*`` variables, threads capped so that N
workers do not oversubscribe the cores, and gloo bound to the loopback interface, so nothing of
the job listens beyond this machine.

When a worker exits with an error or is killed, the failure names the rank that caused it and
the others are killed at once: a stuck worker may not answer SIGTERM (one blocked in native code
never runs a Python handler), and the job has failed anyway. A worker that dies takes its peers
down with connection errors; those are *consequences*, so the launcher prefers a worker's own
error over them, and when every failed rank only reports a broken or timed-out collective, a
rank that left first with status 0 (``sys.exit(0)``, ``os._exit(0)`` mid-run) is the cause, and
else the ranks still running are the ones that stopped responding. A hung worker therefore ends the job
at most ``timeout`` + :data:`STUCK_SLACK_S` seconds after its peers start waiting for it.

Ctrl-C or SIGTERM to the launcher stops the workers and whatever they started (SIGTERM to
them all at once, then SIGKILL after one grace period: :func:`.processes.stop`) and removes
the job's folder; folders of launchers killed outright are removed by the
next launch (:mod:`.scratch`).

Restarts (``--max-restarts``), as torchrun's elastic agent does them: when an attempt fails,
every worker is stopped and all are started again, at most K times, each told its attempt
(``PARASCALE_ATTEMPT``) and what the caller wants it to know (the checkpoint to continue from).
Not after running out of memory (the same batch on the same device runs out again, and a study
records it as a result) nor after a failure that says it would repeat (a diverging loss, an
unreadable file, input refused: ``runtime.failure.repeats``); anything else, a killed, crashed
or stuck worker, may be a passing fault. A restart's store listens on a fresh port: torch's
store would still hold the failed attempt's keys (its peers' addresses, its barrier counts).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from parascale.errors import UsageError
from parascale.interrupts import sigterm_interrupts
from parascale.runtime import contract, failure, memory, memory_cap, processes
from parascale.runtime.env import ATTEMPT_ENV
from parascale.runtime.scratch import make_dir, sweep
from parascale.runtime.rendezvous import LOOPBACK, address_towards, open_store  # noqa: F401

if TYPE_CHECKING:
    import torch.distributed as dist

GRACE_S = 5.0  # how long an interrupted job's workers may take to exit before they are killed
SETTLE_S = 0.5  # after the first failure, wait this long for the root cause to report
POLL_S = 0.05
SAMPLE_EVERY = 5  # polls between samples of the workers' resident memory (0.25 s)
#: a stuck job ends at most this long after its collective timeout: the failing rank's exit,
#: SETTLE_S, killing the rest and writing the record (measured 1.3 s on 2 cores under load 10)
STUCK_SLACK_S = 2.0
#: CPU threads a local launch may ask for, per core, before it needs --oversubscribe
OVERSUBSCRIPTION = 4


@dataclass
class Outcome:
    """How the job ended. ``status`` is ok, failed or oom; ``message`` names the rank;
    ``detail`` is that rank's traceback, when it left one."""

    status: str
    message: str = ""
    rank: int | None = None
    detail: str | None = None
    #: the failure says it would happen again from the same state (``failure.repeats``)
    repeats: bool = False
    ended_at: float = field(default_factory=time.time)
    #: the failed attempts before this one, each followed by a restart (oldest first)
    earlier: list[Outcome] = field(default_factory=list)
    #: the failing rank found its disk full (a result or checkpoint it could not write)
    no_space: bool = False

    @property
    def restartable(self) -> bool:
        return self.status == "failed" and not self.repeats


def check_oversubscription(workers: int, threads: int, cores: int, servers: int = 0,
                           insist: bool = False) -> None:
    """Refuse a local launch that asks for more than OVERSUBSCRIPTION threads per core (workers
    x threads, plus one per parameter server) unless the user insists: 64 workers on 2 cores
    crawl, and 100000 threads each make OpenBLAS fail to load in every worker."""
    total = workers * threads + servers
    limit = OVERSUBSCRIPTION * cores
    if insist or total <= limit:
        return
    room = limit - servers
    fits = [f"at most {room // threads} workers" if room // threads else "",
            f"at most {room // workers} threads per worker" if threads > 1 and room // workers
            else ""]
    advice = " or ".join(f for f in fits if f)
    parts = f"{workers} workers x {threads} threads" + \
        (f" + {servers} parameter servers" if servers else "")
    raise UsageError(f"{total} CPU threads ({parts}) on {cores} cores are more than the {limit} "
                     f"parascale allows ({OVERSUBSCRIPTION} per core): use "
                     f"{advice + ', or ' if advice else ''}--oversubscribe to run it anyway")


class LocalJob:
    """One launch: the store, the processes, their error files and logs."""

    caps: memory_cap.JobCaps | None = None  # --device-memory: a cgroup per worker, from run()

    def __init__(self, module: str, size: int, env: dict[str, str], store: dist.TCPStore,
                 threads: int, cap: int | None = None):
        self.module, self.size, self.env, self.threads = module, size, env, threads
        self.store, self.cap = store, cap
        sweep()  # folders of earlier launchers killed outright (SIGKILL leaves them behind)
        self.tmp = make_dir("parascale-job-")
        self.procs: list[processes.Child] = []
        self.logs: list[Path | None] = []
        # evidence for a worker the kernel kills for lack of memory (runtime/memory.py)
        self.kills_before, self.limit = memory.oom_kills(), memory.limit_bytes()
        self.peaks = memory.Peaks([])
        self.ended: list[int] = []  # ranks in the order their exits were seen

    def run(self) -> Outcome:
        """Start the workers and block until every one succeeded or the job failed; never
        leaves a worker behind."""
        try:
            self.caps = None if self.cap is None else memory_cap.JobCaps(self.size, self.cap)
            self._start()
            outcome = self._watch()
        except BaseException:  # Ctrl-C, SIGTERM: ask the workers to stop, then make sure
            self._stop(GRACE_S)
            raise
        finally:
            self._stop(0.0)  # after a failure the rest are of no use, and may be deaf to SIGTERM
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.caps is not None:
                self.caps.remove()
            sweep()  # what stopped workers could not remove (a rank 0's parameter-server logs)
        return outcome

    def _start(self) -> None:
        for rank in range(self.size):
            wenv = {**os.environ, **self.env,
                    contract.STORE_PORT: str(self.store.port), contract.RANK: str(rank),
                    contract.WORLD_SIZE: str(self.size), contract.LOCAL_RANK: str(rank),
                    contract.ERROR_FILE: str(self.tmp / f"rank{rank}.error.json"),
                    "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads),
                    **(self.caps.env(rank) if self.caps else {})}
            # gloo otherwise listens on whatever the host name resolves to
            wenv.setdefault("GLOO_SOCKET_IFNAME", "lo")
            log = None if rank == 0 else self.tmp / f"rank{rank}.log"
            self.logs.append(log)
            self.procs.append(processes.start_module(self.module, wenv, log, self.threads,
                                                     f"parascale-r{rank}"))
        self.peaks = memory.Peaks([p.pid for p in self.procs])

    def _watch(self) -> Outcome:
        first_failure = None
        polls = 0
        while True:
            if polls % SAMPLE_EVERY == 0:
                self.peaks.sample()
            polls += 1
            codes = [p.poll() for p in self.procs]
            self.ended += [r for r, c in enumerate(codes) if c is not None and r not in self.ended]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed and first_failure is None:
                first_failure = time.monotonic()
                running_then = [r for r, c in enumerate(codes) if c is None]
            if first_failure is not None:
                settled = time.monotonic() - first_failure > SETTLE_S
                primary = any(not self._report(r, c).get("secondary")
                              for r, c in enumerate(codes) if c not in (None, 0))
                if settled or primary or all(c is not None for c in codes):
                    return self._diagnose(codes, running_then)
            elif all(c == 0 for c in codes):
                return Outcome("ok")
            time.sleep(POLL_S)

    def _diagnose(self, codes: list[int | None], running_then: list[int]) -> Outcome:
        reports = {r: self._report(r, c) for r, c in enumerate(codes) if c not in (None, 0)}
        for rank, report in reports.items():
            if report.get("oom"):
                return Outcome("oom", f"rank {rank}: {report['message']}", rank,
                               report.get("detail"))
        primary = [r for r, rep in reports.items() if not rep.get("secondary")]
        if primary:
            return _named(primary[0], reports[primary[0]])
        others = ", ".join(map(str, sorted(reports)))
        cause = next(iter(reports.values()))
        left = [r for r in self.ended if codes[r] == 0 or reports.get(r, {}).get("left")]
        if left:  # those who stayed saw a collective break because this one went
            rank = left[0]
            if rank in reports:
                return _named(rank, reports[rank])
            return Outcome("failed", f"rank {rank} {failure.LEFT_EARLY}; rank"
                           f"{'s' if len(reports) > 1 else ''} {others} then {cause['message']}",
                           rank, cause.get("detail"))
        if running_then:
            rank = running_then[0]
            return Outcome("failed", f"rank {rank} stopped responding (still running but not "
                           f"taking part in collectives); rank(s) {others} gave up: "
                           f"{cause['message']}", rank, cause.get("detail"))
        return _named(min(reports), reports[min(reports)])

    def _report(self, rank: int, code: int) -> dict:
        """What a failed worker said about itself, or what its exit code and log tell."""
        if self.caps is not None and (over := self.caps.oom_line(rank)):
            return {"message": over, "oom": True}  # whatever the worker said as it went
        error_file = self.tmp / f"rank{rank}.error.json"
        if error_file.exists():
            try:
                report = json.loads(error_file.read_text())
                if not report.get("left"):  # "rank 1 exited with status 0 before ..."
                    report["message"] = f"failed: {report['message']}"
                return report
            except (OSError, ValueError, KeyError):
                pass
        message = processes.exit_text(code)
        tail = processes.tail(self.logs[rank], f"[rank {rank}] ")
        if code == -signal.SIGKILL:  # the kernel's out-of-memory killer sends SIGKILL
            evidence = memory.killed_for_memory(self.kills_before, self.peaks.bytes[rank],
                                                self.limit)
            if evidence:
                return {"message": f"{message}, out of memory: {evidence}", "oom": True}
        return {"message": message + (f"; its last output: {tail}" if tail else "")}

    def _stop(self, grace_s: float) -> None:
        processes.stop(self.procs, grace_s)


def _named(rank: int, report: dict) -> Outcome:
    """The job failed as ``rank`` says it did."""
    return Outcome("failed", f"rank {rank} {report['message']}", rank, report.get("detail"),
                   bool(report.get("repeats")), no_space=bool(report.get("no_space")))


def launch(module: str, size: int, env: dict[str, str], port: int | None = None,
           threads: int = 1, store: dist.TCPStore | None = None, max_restarts: int = 0,
           restart: Callable[[int, Outcome], dict[str, str]] | None = None,
           cap: int | None = None) -> Outcome:
    """Run ``python -m module`` as ``size`` ranks and wait; Ctrl-C and SIGTERM stop every
    worker. ``store``: one already opened with :func:`open_store` (else one on ``port``).
    ``cap``: each worker's memory cap in bytes (``--device-memory``: a memory cgroup per
    worker, :mod:`.memory_cap`), None for none.

    ``max_restarts``: start every worker again after a failure that allows it (module
    docstring), at most this many times; ``restart(attempt, failed)`` gives the environment
    changes of attempt ``attempt`` (1 for the first restart). The outcome is the last
    attempt's, with the ones restarted before it in ``earlier``.
    """
    with sigterm_interrupts():
        store = store or open_store(port)
        earlier: list[Outcome] = []
        for attempt in range(max_restarts + 1):
            if attempt:
                env = {**env, **(restart(attempt, earlier[-1]) if restart else {})}
                store = open_store()  # the failed attempt's keys stay in the old one
            outcome = LocalJob(module, size, {**env, ATTEMPT_ENV: str(attempt)}, store,
                               threads, cap).run()
            if not outcome.restartable or attempt == max_restarts:
                break
            earlier.append(outcome)
        outcome.earlier = earlier
        return outcome
