"""What a rank says about its failure, and which faults a rank reads, in one process: the
launcher's diagnosis rests on these (the multi-process tests are in test_train_failures.py)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from parascale.errors import KnownFailure, UsageError
from parascale.runtime.failure import (DETAIL_LIMIT, describe, detail, is_out_of_memory,
                                       is_secondary, write_error_file)
from parascale.runtime.faults import ENV, Faults


@pytest.mark.parametrize("exc", [
    dist.DistError("anything"),
    KnownFailure("stopping: rank 1 diverged", secondary=True),
    RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
    RuntimeError("Timed out waiting 30000ms for recv operation"),
    RuntimeError("Broken pipe"),
])
def test_a_failure_to_talk_to_other_ranks_is_secondary(exc):
    assert is_secondary(exc)


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
    KnownFailure("the data file timed out on read"),  # its own failure, whatever the words
    ValueError("socket"),  # only a RuntimeError from a collective carries those words
    torch.OutOfMemoryError("out of memory"),
])
def test_a_failure_of_the_ranks_own_work_is_not_secondary(exc):
    assert not is_secondary(exc)


def test_describe_is_one_line_and_a_known_failure_speaks_for_itself():
    assert describe(ValueError("bad value\nmore lines")) == "ValueError: bad value"
    assert describe(RuntimeError()) == "RuntimeError"
    assert describe(KnownFailure("loss is NaN at step 3\nadvice")) == "loss is NaN at step 3"
    assert describe(ValueError("x" * 1000)) == "ValueError: " + "x" * 400


def raised_from_a_cause(message: str) -> RuntimeError:
    """A RuntimeError raised while handling a KeyError, with its traceback, as a rank has it."""
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError(message) from inner
    except RuntimeError as exc:
        return exc


def test_detail_names_the_cause():
    text = detail(raised_from_a_cause("outer"))
    assert "KeyError: 'inner'" in text and "RuntimeError: outer" in text


def test_detail_of_a_long_traceback_keeps_its_end():
    text = detail(raised_from_a_cause("outer " + "y" * (2 * DETAIL_LIMIT) + " end"))
    assert len(text) == DETAIL_LIMIT
    assert text.rstrip().endswith("y end")  # the error itself comes last: that is what matters


def test_the_error_file_tells_the_launcher_message_secondary_and_out_of_memory(
        tmp_path, monkeypatch):
    path = tmp_path / "rank1.error.json"
    monkeypatch.setenv("PARASCALE_ERROR_FILE", str(path))
    write_error_file(torch.OutOfMemoryError("CUDA out of memory"))
    report = json.loads(path.read_text())
    assert report["message"] == "OutOfMemoryError: CUDA out of memory"
    assert report["oom"] is True and report["secondary"] is False
    assert "OutOfMemoryError" in report["detail"]
    write_error_file(RuntimeError("Connection reset by peer"))  # replaces the earlier report
    report = json.loads(path.read_text())
    assert report["secondary"] is True and report["oom"] is False
    assert not (tmp_path / "rank1.error.json.tmp").exists()


def test_without_an_error_file_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("PARASCALE_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    write_error_file(RuntimeError("boom"))
    assert list(tmp_path.iterdir()) == []


def test_out_of_memory_is_either_kind():
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("out of memory"))


def test_faults_from_env_picks_this_ranks_faults_and_every_ranks_oom(monkeypatch):
    monkeypatch.setenv(ENV, "kill@1:3, slow@0:0.5,nan@0:7,oom@64,raise@1:2,hang@2:9,exit@3:4,"
                       "sysexit@2:5")
    assert Faults.from_env(0) == Faults(0, nan_at=7, slow_s=0.5, oom_batch=64)
    assert Faults.from_env(1) == Faults(1, kill_at=3, raise_at=2, oom_batch=64)
    assert Faults.from_env(2) == Faults(2, hang_at=9, sysexit_at=5, oom_batch=64)
    assert Faults.from_env(3) == Faults(3, exit_at=4, oom_batch=64)
    assert type(Faults.from_env(1).kill_at) is int  # steps compare with the loop's int counter


def test_faults_from_env_without_the_variable_is_no_fault(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert Faults.from_env(0) == Faults(0)
    monkeypatch.setenv(ENV, "  ")
    assert Faults.from_env(0) == Faults(0)


def test_faults_from_env_refuses_what_it_cannot_read(monkeypatch):
    monkeypatch.setenv(ENV, "kill@1:3,explode@0:1")
    with pytest.raises(UsageError, match="cannot read 'explode@0:1'"):
        Faults.from_env(0)


def test_faults_act_at_their_step_and_batch():
    faults = Faults(0, raise_at=2, nan_at=3, oom_batch=64)
    faults.before_step(1, 32)
    with pytest.raises(RuntimeError, match="injected fault on rank 0 at step 2"):
        faults.before_step(2, 32)
    with pytest.raises(torch.OutOfMemoryError):
        faults.before_step(1, 64)
    assert faults.loss(2, torch.tensor(1.5)).item() == 1.5
    assert torch.isnan(faults.loss(3, torch.tensor(1.5)))
