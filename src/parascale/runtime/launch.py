"""Start N worker processes on this machine, watch them, and end the job when one fails.

The launcher hosts the rendezvous TCPStore itself, on loopback, on a port the operating system
chooses (or the user's ``--port``), and passes that port to the workers: no free-port guessing,
so no race between choosing a port and binding it. Each worker is a fresh interpreter
(``python -m <module>``) with its rank in ``PARASCALE_*`` variables, threads capped so that N
workers do not oversubscribe the cores, and gloo bound to the loopback interface.

When a worker exits with an error or is killed, the others are stopped at once (SIGTERM, then
SIGKILL after a grace period) and the failure names the rank that caused it. A worker that dies
takes its peers down with connection errors; those are *consequences*, so the launcher prefers a
worker's own error over them, and when every failed rank only reports a broken or timed-out
collective, the ranks still running are the ones that stopped responding.
"""
from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from parascale.errors import UsageError
from parascale.runtime.world import LOCAL_ENV

GRACE_S = 5.0  # how long a stopped worker may take to exit before it is killed
SETTLE_S = 1.0  # after the first failure, wait this long for the root cause to report
LOG_TAIL = 12  # lines of a failed worker's log shown to the user


@dataclass
class Outcome:
    """How the job ended. ``status`` is ok, failed or oom; ``message`` names the rank;
    ``detail`` is that rank's traceback, when it left one."""

    status: str
    message: str = ""
    rank: int | None = None
    detail: str | None = None


def _open_store(port: int | None) -> dist.TCPStore:
    try:
        return dist.TCPStore("127.0.0.1", port or 0, is_master=True, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=60))
    except dist.DistNetworkError as exc:
        if "EADDRINUSE" in str(exc) or "in use" in str(exc):
            raise UsageError(f"--port {port} is already in use on 127.0.0.1; choose another "
                             "port or leave --port out to let parascale pick a free one") from None
        raise UsageError(f"cannot listen on 127.0.0.1:{port}: {exc}") from None


def _die_with_launcher() -> None:
    """Runs in each worker before exec: if the launcher dies, even by SIGKILL, so does the
    worker (Linux's parent-death signal), instead of training on as an orphan."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: workers may outlive a killed launcher
        pass


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class LocalJob:
    """One launch: the store, the processes, their error files and logs."""

    def __init__(self, module: str, size: int, env: dict[str, str], port: int | None,
                 threads: int):
        self.size = size
        self.store = _open_store(port)
        self.tmp = Path(tempfile.mkdtemp(prefix="parascale-job-"))
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path | None] = []
        for rank in range(size):
            wenv = {**os.environ, **env,
                    LOCAL_ENV: str(self.store.port), "PARASCALE_RANK": str(rank),
                    "PARASCALE_WORLD_SIZE": str(size), "PARASCALE_LOCAL_RANK": str(rank),
                    "PARASCALE_ERROR_FILE": str(self.tmp / f"rank{rank}.error.json"),
                    "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            # gloo otherwise binds to whatever the host name resolves to
            wenv.setdefault("GLOO_SOCKET_IFNAME", "lo")
            log = None if rank == 0 else self.tmp / f"rank{rank}.log"
            out = None if log is None else open(log, "wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", module], env=wenv, stdout=out, stderr=out,
                stdin=subprocess.DEVNULL, preexec_fn=_die_with_launcher))
            if out is not None:
                out.close()
            self.logs.append(log)

    def wait(self) -> Outcome:
        """Block until every worker succeeded or the job failed; never leaves a worker behind."""
        try:
            return self._watch()
        finally:
            self._stop()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _watch(self) -> Outcome:
        first_failure = None
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed and first_failure is None:
                first_failure = time.monotonic()
                running_then = [r for r, c in enumerate(codes) if c is None]
            if first_failure is not None:
                settled = time.monotonic() - first_failure > SETTLE_S
                if settled or all(c is not None for c in codes):
                    return self._diagnose(codes, running_then)
            elif all(c == 0 for c in codes):
                return Outcome("ok")
            time.sleep(0.05)

    def _diagnose(self, codes: list[int | None], running_then: list[int]) -> Outcome:
        reports = {r: self._report(r, c) for r, c in enumerate(codes) if c not in (None, 0)}
        for rank, report in reports.items():
            if report.get("oom"):
                return Outcome("oom", f"rank {rank}: {report['message']}", rank,
                               report.get("detail"))
        primary = [r for r, rep in reports.items() if not rep.get("secondary")]
        if primary:
            rank = primary[0]
            return Outcome("failed", f"rank {rank} {reports[rank]['message']}", rank,
                           reports[rank].get("detail"))
        if running_then:
            rank = running_then[0]
            others = ", ".join(map(str, sorted(reports)))
            cause = next(iter(reports.values()))
            return Outcome("failed", f"rank {rank} stopped responding (still running but not "
                           f"taking part in collectives); rank(s) {others} gave up: "
                           f"{cause['message']}", rank, cause.get("detail"))
        rank = min(reports)
        return Outcome("failed", f"rank {rank} {reports[rank]['message']}", rank,
                       reports[rank].get("detail"))

    def _report(self, rank: int, code: int) -> dict:
        """What a failed worker said about itself, or what its exit code and log tell."""
        error_file = self.tmp / f"rank{rank}.error.json"
        if error_file.exists():
            try:
                report = json.loads(error_file.read_text())
                report["message"] = f"failed: {report['message']}"
                return report
            except (OSError, ValueError, KeyError):
                pass
        if code < 0:
            message = f"was killed by {_signal_name(code)}"
        else:
            message = f"exited with code {code}"
        tail = self._tail(rank)
        return {"message": message + (f"; its last output: {tail}" if tail else "")}

    def _tail(self, rank: int) -> str:
        log = self.logs[rank]
        if log is None or not log.exists():
            return ""
        lines = log.read_text(errors="replace").strip().splitlines()[-LOG_TAIL:]
        return " | ".join(f"[rank {rank}] {line}" for line in lines if line.strip())

    def _stop(self) -> None:
        alive = [p for p in self.procs if p.poll() is None]
        for p in alive:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for p in alive:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def launch(module: str, size: int, env: dict[str, str], port: int | None = None,
           threads: int = 1) -> Outcome:
    """Run ``python -m module`` as ``size`` ranks and wait; Ctrl-C stops every worker."""
    job = LocalJob(module, size, env, port, threads)
    return job.wait()
