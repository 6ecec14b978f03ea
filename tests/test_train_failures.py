"""A worker that dies, crashes, stalls or runs out of memory ends the job fast, naming the rank."""
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # every test here starts worker processes

FAST = dict(workers=2, global_batch=32, epochs=2, timeout=10.0)


@pytest.fixture
def fault(monkeypatch):
    def set_fault(text):
        monkeypatch.setenv("PARASCALE_FAULT", text)
    return set_fault


def test_killed_worker_is_named_and_no_success_is_recorded(train_run, fault):
    fault("kill@1:3")
    start = time.monotonic()
    record, state = train_run(expect="failed", **FAST)
    assert time.monotonic() - start < 60  # bounded: far below any process-group default
    assert record["status"] == "failed"
    assert "rank 1" in record["reason"] and "SIGKILL" in record["reason"]
    assert state is None  # no model from a failed run


def test_crashing_worker_is_named_with_its_error(train_run, fault):
    fault("raise@1:2")
    record, _ = train_run(expect="failed", **FAST)
    assert record["status"] == "failed"
    assert record["reason"].startswith("rank 1 failed: RuntimeError: injected fault")


def test_stuck_worker_is_named_after_the_collective_timeout(train_run, fault):
    fault("hang@1:2")
    start = time.monotonic()
    record, _ = train_run(expect="failed", **{**FAST, "timeout": 5.0})
    assert time.monotonic() - start < 60
    assert record["status"] == "failed"
    assert record["reason"].startswith("rank 1 stopped responding"), record["reason"]


def test_out_of_memory_is_a_result(train_run, fault):
    fault("oom@16")
    record, _ = train_run(expect="oom", **FAST)
    assert record["status"] == "oom"
    assert "per-device batch 16" in record["reason"]


def test_cli_reports_the_failed_rank_and_exits_non_zero(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PARASCALE_FAULT": "raise@1:2"}
    proc = subprocess.run([sys.executable, "-m", "parascale", "train", "--workers", "2",
                           "--epochs", "1", "--timeout", "10", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("parascale: failed: rank 1 failed: RuntimeError"), proc.stderr
    assert json.loads((out / "record.json").read_text())["status"] == "failed"


def _alive(pid: int) -> bool:
    """Running, sleeping or stopped; a zombie (dead, not yet reaped) does not count."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_workers_die_with_a_killed_launcher(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-m", "parascale", "train", "--workers", "2",
                                 "--epochs", "500", "--no-save-model", "--out",
                                 str(tmp_path / "run")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    workers = []
    while len(workers) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        found = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True,
                               text=True).stdout.split()
        workers = [int(p) for p in found]
    assert len(workers) == 2, "the workers never started"
    launcher.kill()
    launcher.wait()
    time.sleep(1)
    assert [p for p in workers if _alive(p)] == []
