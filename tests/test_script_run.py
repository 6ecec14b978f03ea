"""``parascale run``: a user's own script on N workers, through parascale.script's API.

The foundation holds through the API (2 copies with half the batch end where 1 with all of it
does), the record is train's (report and predict read it), and bad launch input is one line.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import assert_same, one_line_error
from parascale.cli.main import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPT = EXAMPLES / "digits_parascale.py"


def run_script(capfd, out: Path, workers: int, batch: int, *extra: str) -> dict:
    capfd.readouterr()
    code = main(["run", "--workers", str(workers), "--timeout", "60", "--out", str(out),
                 *extra, str(SCRIPT), "--epochs", "2", "--batch-size", str(batch)])
    output = capfd.readouterr()
    assert code == 0, output.out + output.err
    return json.loads((out / "record.json").read_text())


@pytest.mark.slow
def test_two_copies_with_half_the_batch_end_where_one_with_all_of_it_does(tmp_path, capfd):
    study = tmp_path / "study" / "runs"
    one = run_script(capfd, study / "one", 1, 32)
    two = run_script(capfd, study / "two", 2, 16)
    assert two["derived"]["world_size"] == 2 and two["derived"]["global_batch"] == 32
    assert_same(torch.load(study / "one" / "model.pt"), torch.load(study / "two" / "model.pt"))
    # the record is train's: its steps split, its epochs, the metric the script logged
    assert set(two["steps"]["phases"]) == {"data", "compute", "sync", "optimizer", "step"}
    assert [e["epoch"] for e in two["epochs"]] == [1, 2]
    assert two["summary"]["final_test_accuracy"] == two["epochs"][-1]["test_accuracy"]
    assert {"name": "accuracy", "higher_is_better": True} in two["task"]["metrics"]
    assert one["epochs"][-1]["test_accuracy"] == pytest.approx(
        two["epochs"][-1]["test_accuracy"], abs=1e-3)
    # ... which report and predict read unchanged
    assert main(["report", str(tmp_path / "study"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.html").exists()
    assert main(["predict", str(study / "two" / "record.json"), "--interconnect",
                 "loopback", "--workers", "1,2,4"]) == 0
    assert "speedup" in capfd.readouterr().out


def refused(capsys, tmp_path, *args: str) -> str:
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), *args]) == 2
    assert not out.exists()
    return one_line_error(capsys)


def test_no_such_script_is_one_line(tmp_path, capsys):
    assert "no such script" in refused(capsys, tmp_path, str(tmp_path / "none.py"))


def test_a_file_that_is_not_a_python_script_is_one_line(tmp_path, capsys):
    data = tmp_path / "train.sh"
    data.write_text("echo hi\n")
    assert "not a Python script" in refused(capsys, tmp_path, str(data))


def test_a_script_argument_parascale_would_take_for_its_own_is_one_line(tmp_path, capsys):
    line = refused(capsys, tmp_path, str(SCRIPT), "--epochs", "1", "--workers", "2")
    assert "--workers comes after digits_parascale.py" in line and "--" in line


def test_a_strategy_the_api_cannot_run_is_refused_naming_why(tmp_path, capsys):
    line = refused(capsys, tmp_path, "--sync", "zero", str(SCRIPT))
    assert "--sync zero cannot run a script" in line and "optimizer" in line


def test_a_strategy_option_is_checked_before_anything_starts(tmp_path, capsys):
    line = refused(capsys, tmp_path, "--sync", "local-sgd", "--compression", "fp16",
                   str(SCRIPT))
    assert "--compression" in line
