"""A worker the kernel kills for lack of memory is recorded as out of memory, with the evidence,
on a real cgroup memory limit; a SIGKILL for any other reason stays a failure."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parascale.runtime import memory
from parascale.runtime.faults import Faults, parse

V1 = Path("/sys/fs/cgroup/memory")
LIMIT = 1536 << 20  # a 2-worker mlp job needs well under this; the hog does not stop


def test_the_hog_fault_is_read():
    assert parse("hog@1:3") == [("hog", 1, 3.0)]
    assert Faults.from_env(1).hog_at is None  # nothing set in this process


def test_the_evidence_names_the_cgroup_count_and_the_peak():
    assert memory.killed_for_memory(None, 10, 100) is None
    near = memory.killed_for_memory(None, 90 << 20, 100 << 20)
    assert near and "0.09 GiB of the 0.10 GiB" in near
    count = memory.oom_kills()
    if count is not None:
        counted = memory.killed_for_memory(count - 1, 1 << 20, 100 << 30)
        assert counted.startswith("the memory cgroup counted 1 out-of-memory kill(s)")


def memory_cgroup(tmp_name: str) -> Path:
    """A child of this process's v1 memory cgroup with LIMIT, or a skip where none can be made."""
    try:
        own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text()
                   .splitlines() if "memory" in line.split(":")[1].split(","))
        group = V1 / own.strip("/") / tmp_name
        group.mkdir()
    except (OSError, StopIteration):
        pytest.skip("no writable cgroup v1 memory controller on this machine")
    (group / "memory.limit_in_bytes").write_text(str(LIMIT))
    return group


def train_in(group: Path, out: Path, fault: str) -> subprocess.CompletedProcess:
    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    env = {**os.environ, "PARASCALE_FAULT": fault}
    return subprocess.run([sys.executable, "-m", "parascale", "train", "--workers", "2",
                           "--model", "mlp", "--steps", "6", "--timeout", "60",
                           "--no-save-model", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300, preexec_fn=join)


@pytest.mark.slow
def test_a_worker_killed_for_memory_is_recorded_oom_with_the_evidence(tmp_path):
    group = memory_cgroup(f"parascale-test-{os.getpid()}")
    try:
        proc = train_in(group, tmp_path / "hog", "hog@1:3")
        record = json.loads((tmp_path / "hog" / "record.json").read_text())
        assert record["status"] == "oom", (record["status"], record["reason"], proc.stderr)
        assert record["reason"].startswith("rank 1: was killed by SIGKILL, out of memory: ")
        assert "out-of-memory kill" in record["reason"]
        # the same job killed by SIGKILL otherwise is a failure, not out of memory
        proc = train_in(group, tmp_path / "kill", "kill@1:3")
        record = json.loads((tmp_path / "kill" / "record.json").read_text())
        assert record["status"] == "failed" and "rank 1 was killed by SIGKILL" in \
            record["reason"], proc.stderr
    finally:
        remove(group)


def remove(group: Path) -> None:
    """Remove the cgroup once its last process has exited (the job's exit can lag on a busy
    machine), moving any straggler to the parent first."""
    deadline = time.monotonic() + 30
    while True:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(pid)
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
