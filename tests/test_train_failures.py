"""A worker that dies, crashes, stalls or runs out of memory ends the job fast, naming the rank."""
import signal
import subprocess
import time

import pytest

from helpers import STUCK_SLACK_S, began, cli, train_captured

pytestmark = pytest.mark.slow  # every test here starts worker processes

FAST = dict(workers=2, global_batch=32, epochs=2, timeout=10.0)


@pytest.fixture
def fault(monkeypatch):
    def set_fault(text):
        monkeypatch.setenv("PARASCALE_FAULT", text)
    return set_fault


def test_killed_worker_is_named_and_no_success_is_recorded(train_run, fault):
    fault("kill@1:3")
    # bounded: the run returns (pytest's timeout would fail it long before any process-group
    # default of 30 min), and it names the signal, so it was the death that ended it
    record, state = train_run(expect="failed", **FAST)
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
    record, _ = train_run(expect="failed", **{**FAST, "timeout": 5.0})
    assert record["status"] == "failed"
    assert record["reason"].startswith("rank 1 stopped responding"), record["reason"]


@pytest.mark.parametrize("how", ["exit", "sysexit"])
def test_a_worker_that_leaves_with_status_0_mid_run_is_named(train_run, fault, how):
    fault(f"{how}@1:3")  # os._exit(0), sys.exit(0): rank 0's collective breaks, not its work
    record, state = train_run(expect="failed", **FAST)
    # os._exit(0) leaves no word: the launcher names the rank that left first; a sys.exit(0)
    # is caught in the worker, which names the rank and the line that called it
    expected = {"exit": "rank 1 exited with status 0 before the run finished",
                "sysexit": "rank 1 failed: the user's code called sys.exit(0)"}[how]
    assert record["reason"].startswith(expected), record["reason"]
    assert state is None


def test_out_of_memory_is_a_result(train_run, fault):
    fault("oom@16")
    record, _ = train_run(expect="oom", **FAST)
    assert record["status"] == "oom"
    assert "per-device batch 16" in record["reason"]


def test_cli_reports_the_failed_rank_and_exits_non_zero(tmp_path, capfd):
    proc, record = train_captured(tmp_path, capfd, "--workers", "2", "--epochs", "1",
                                  fault="raise@1:2")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("parascale: failed: rank 1 failed: RuntimeError"), proc.stderr
    assert record["status"] == "failed"


@pytest.mark.slow
def test_a_hung_worker_ends_the_job_within_timeout_and_the_stated_slack(tmp_path):
    """Rank 1 hangs before step 3. Its processes ignore SIGTERM, as a worker stuck in native
    code does when a library installed a Python SIGTERM handler (which can never run there).
    The job must end within --timeout + STUCK_SLACK_S of the hang, with 3 s to spare for a busy
    machine; counting a grace period for the hung worker (5 s) breaks that."""
    timeout = 5.0
    proc = cli("train", "--workers", "2", "--model", "mlp", "--epochs", "2", "--timeout",
               str(timeout), "--no-save-model", "--out", str(tmp_path / "run"),
               tmpdir=tmp_path / "tmp", fault="hang@1:3", stdout=subprocess.PIPE,
               stderr=subprocess.PIPE,
               preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    assert began(proc), "training never began"
    hung = time.monotonic()  # two steps of an mlp later, rank 1 hangs: this is no later
    _, stderr = proc.communicate(timeout=120)
    ended = time.monotonic() - hung
    assert proc.returncode == 1
    assert "rank 1 stopped responding" in stderr
    assert ended <= timeout + STUCK_SLACK_S + 3.0, f"the job ended {ended:.1f} s after the hang"
