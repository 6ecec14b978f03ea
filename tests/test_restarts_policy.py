"""Restarts and the console log in one process: which failures are restarted, what each attempt
is told, which faults fire in which attempt, and what reaches log.txt (the real restarts, with
SIGKILLed workers, are in test_restarts.py)."""
from __future__ import annotations

import json
import sys

import pytest

from parascale.errors import KnownFailure, UsageError
from parascale.runtime import local
from parascale.runtime.env import ATTEMPT_ENV
from parascale.runtime.failure import repeats
from parascale.runtime.faults import ENV, Faults
from parascale.training.observe.console import ConsoleLog, terminal


@pytest.mark.parametrize("outcome, restartable", [
    (local.Outcome("failed", "rank 1 was killed by SIGKILL", 1), True),
    (local.Outcome("failed", "rank 1 failed: loss is nan", 1, repeats=True), False),
    (local.Outcome("oom", "rank 0: out of memory", 0), False),
    (local.Outcome("ok"), False),
])
def test_what_is_restarted(outcome, restartable):
    assert outcome.restartable is restartable


def test_a_failure_that_would_repeat_says_so():
    assert repeats(KnownFailure("training loss is nan at step 3"))
    assert repeats(UsageError("--resume: other settings"))
    assert not repeats(KnownFailure("stopping: rank 1 diverged", secondary=True))
    assert not repeats(RuntimeError("injected fault on rank 1 at step 5"))


class FakeJob:
    """Stands in for LocalJob: each attempt ends as the test says, and what it was told is kept."""

    ends: list[local.Outcome] = []
    told: list[dict[str, str]] = []

    def __init__(self, module, size, env, store, threads, cap=None):
        FakeJob.told.append(dict(env))

    def run(self) -> local.Outcome:
        return FakeJob.ends.pop(0)


@pytest.fixture
def fake_jobs(monkeypatch):
    monkeypatch.setattr(local, "LocalJob", FakeJob)
    stores = iter(range(100))
    monkeypatch.setattr(local, "open_store", lambda *args, **kwargs: next(stores))
    FakeJob.told = []

    def ends(*outcomes: local.Outcome) -> None:
        FakeJob.ends = list(outcomes)

    return ends


def test_every_worker_starts_again_until_an_attempt_succeeds(fake_jobs):
    killed = local.Outcome("failed", "rank 1 was killed by SIGKILL", 1)
    fake_jobs(killed, local.Outcome("failed", "rank 0 stopped responding", 0),
              local.Outcome("ok"))
    asked = []

    def restart(attempt, failed):
        asked.append((attempt, failed.rank))
        return {"PARASCALE_RESUME": f"from attempt {attempt}"}

    outcome = local.launch("m", 2, {"A": "1"}, max_restarts=3, restart=restart)
    assert outcome.status == "ok" and [o.rank for o in outcome.earlier] == [1, 0]
    assert asked == [(1, 1), (2, 0)]
    assert [t[ATTEMPT_ENV] for t in FakeJob.told] == ["0", "1", "2"]
    assert FakeJob.told[0].get("PARASCALE_RESUME") is None
    assert FakeJob.told[2]["PARASCALE_RESUME"] == "from attempt 2" and FakeJob.told[2]["A"] == "1"


def test_restarts_stop_at_the_limit_with_the_last_failure(fake_jobs):
    fake_jobs(*(local.Outcome("failed", f"attempt {k}", 1) for k in range(3)))
    outcome = local.launch("m", 2, {}, max_restarts=2)
    assert outcome.message == "attempt 2" and len(outcome.earlier) == 2
    assert FakeJob.ends == []


@pytest.mark.parametrize("end", [local.Outcome("oom", "rank 0: out of memory", 0),
                                 local.Outcome("failed", "loss is nan", 0, repeats=True)])
def test_no_restart_after_running_out_of_memory_or_a_failure_that_repeats(fake_jobs, end):
    fake_jobs(end, local.Outcome("ok"))
    outcome = local.launch("m", 2, {}, max_restarts=5)
    assert outcome is end and outcome.earlier == [] and len(FakeJob.told) == 1


def test_the_launcher_reads_whether_a_failure_repeats_from_the_error_file(tmp_path):
    job = local.LocalJob.__new__(local.LocalJob)  # no store, no processes: the diagnosis alone
    job.tmp, job.logs = tmp_path, [None, None]
    (tmp_path / "rank1.error.json").write_text(json.dumps(
        {"message": "training loss is nan at step 3", "secondary": False, "oom": False,
         "repeats": True, "detail": "..."}))
    outcome = job._diagnose([None, 1], [0])
    assert outcome.rank == 1 and outcome.repeats and not outcome.restartable


def test_an_event_fires_in_the_first_attempt_only_unless_told(monkeypatch):
    monkeypatch.setenv(ENV, "kill@1:5,raise@1:3/1,hang@1:9/*,slow@1:0.5")
    assert Faults.from_env(1, attempt=0) == Faults(1, kill_at=5, hang_at=9, slow_s=0.5)
    assert Faults.from_env(1, attempt=1) == Faults(1, raise_at=3, hang_at=9, slow_s=0.5)
    assert Faults.from_env(1, attempt=2) == Faults(1, hang_at=9, slow_s=0.5)
    with pytest.raises(UsageError, match=r"/A \(attempt A only\) or /\* \(every attempt\)"):
        monkeypatch.setenv(ENV, "kill@1:5/x")
        Faults.from_env(1)


def test_the_log_keeps_whole_lines_without_progress_bars(tmp_path, capsys):
    log = ConsoleLog(tmp_path / "log.txt", fresh=True)
    with log.tee():
        print("parascale: starting 2 workers...")
        sys.stderr.write("\r epoch 1/3:  40%|####      | 2/5\r")
        sys.stderr.write("\r\x1b[A epoch 1/3: 100%|##########| 5/5\r          \r")
        print("epoch 1/3: 0.20 s", flush=True)
        terminal(sys.stderr).write("a bar drawn on the terminal alone\n")
    log.line("parascale: finished")
    assert "starting 2 workers" in capsys.readouterr().out  # the terminal sees it too
    assert (tmp_path / "log.txt").read_text().splitlines() == [
        "parascale: starting 2 workers...", "epoch 1/3: 0.20 s", "parascale: finished"]
    ConsoleLog(tmp_path / "log.txt").line("appended")  # a restarted attempt appends
    assert (tmp_path / "log.txt").read_text().splitlines()[-1] == "appended"


@pytest.mark.parametrize("error, words", [
    (KeyboardInterrupt(), "parascale: interrupted (KeyboardInterrupt) at "),
    (KnownFailure("training loss is nan at step 3"), "training loss is nan at step 3"),
    (ValueError("boom"), "ValueError: boom"),  # an unexpected error: its traceback
])
def test_the_log_says_how_the_run_ended(tmp_path, error, words):
    log = ConsoleLog(tmp_path / "log.txt", fresh=True)
    with pytest.raises(type(error)), log.tee():
        print("epoch 1/3: 0.20 s")
        raise error
    text = (tmp_path / "log.txt").read_text()
    assert text.startswith("epoch 1/3: 0.20 s\n") and words in text
    assert ("Traceback" in text) == isinstance(error, ValueError)
