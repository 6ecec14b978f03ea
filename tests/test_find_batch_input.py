"""``parascale find-batch`` refuses bad input in one line (exit 2) before the search starts: no
probe process is started (this fast tier fails a test that starts one)."""
from __future__ import annotations

import pytest
import torch

from conftest import one_line_error
from parascale.cli.main import main

BASE = ["find-batch", "--model", "mlp", "--dataset", "digits"]


def refused(capsys, *args: str) -> str:
    assert main([*BASE, *args]) == 2
    return one_line_error(capsys)


@pytest.mark.parametrize("value", ["nan", "inf", "-0.1", "0"])
def test_a_learning_rate_that_is_not_a_positive_finite_number(capsys, value):
    assert "--lr must be" in refused(capsys, "--lr", value)


def test_a_learning_rate_that_scales_beyond_a_float(capsys):
    # refused by the bound every command shares, before any scaling
    assert "--lr must be in" in refused(capsys, "--lr", "1e308", "--devices", "1,16")


@pytest.mark.parametrize("value", ["0", "1,0,4", "-2", "", "1,,2", "2x"])
def test_device_counts_must_be_positive(capsys, value):
    error = refused(capsys, "--devices", value)
    assert "--devices" in error and "1,2,4" in error


def test_out_naming_a_folder_is_refused_before_the_search(tmp_path, capsys):
    error = refused(capsys, "--out", str(tmp_path))
    assert f"--out {tmp_path} is a folder" in error
    assert list(tmp_path.iterdir()) == []


def test_out_in_a_place_that_cannot_be_written(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert "--out" in refused(capsys, "--out", str(tmp_path / "file" / "found.json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpus_without_cuda_says_so_as_train_does(capsys):
    error = refused(capsys, "--gpus", "0")
    assert "needs CUDA" in error
    # each command says what to do instead in its own options: find-batch has no --workers
    assert "leave out --gpus" in error and "--workers" not in error
    assert main(["train", "--model", "mlp", "--gpus", "0"]) == 2
    said = one_line_error(capsys)
    assert said.split(" needs CUDA")[0] == error.split(" needs CUDA")[0]
    assert "--workers N" in said


def test_a_gpu_that_is_not_there_or_negative(capsys):
    assert "--gpus" in refused(capsys, "--gpus", "4096")
    assert "--gpus" in refused(capsys, "--gpus", "-1")
