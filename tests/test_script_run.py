"""``parascale run``: a user's own script on N workers, through parascale.script's API.

The foundation holds through the API (2 copies with half the batch end where 1 with all of it
does), the record is train's (report and predict read it), and bad launch input is one line.
"""
from __future__ import annotations

import ast
import difflib
import json
import os
import socket
import subprocess
import sys
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
    two = run_script(capfd, study / "two", 2, 16, "--target-accuracy", "0.5")
    assert two["derived"]["world_size"] == 2 and two["derived"]["global_batch"] == 32
    assert_same(torch.load(study / "one" / "model.pt"), torch.load(study / "two" / "model.pt"))
    # the record is train's: its steps split, its epochs, the metric the script logged
    assert set(two["steps"]["phases"]) == {"data", "compute", "sync", "optimizer", "step"}
    assert [e["epoch"] for e in two["epochs"]] == [1, 2]
    assert two["summary"]["final_test_accuracy"] == two["epochs"][-1]["test_accuracy"]
    assert {"name": "accuracy", "higher_is_better": True} in two["task"]["metrics"]
    assert two["time_to_accuracy"]["reached"] and two["time_to_accuracy"]["epoch"] == 1
    log = (study / "two" / "log.txt").read_text()  # the launcher's lines and rank 0's
    assert "starting 2 copies" in log and "epoch 2: loss" in log
    assert one["epochs"][-1]["test_accuracy"] == pytest.approx(
        two["epochs"][-1]["test_accuracy"], abs=1e-3)
    # the training loss is every rank's losses over every sample (one gather: rank 0's half
    # alone would be about half of it), the same steps' as one copy's
    for alone, together in zip(one["epochs"], two["epochs"]):
        assert together["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-5)
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


def test_reduce_broadcast_runs_a_script():
    """Issue 32: it was refused as needing the trainer's step, yet its whole exchange is in
    ``synchronize``, which the API calls before the script's own step; the combination matrix
    (test_matrix_processes.py) holds its scripts to one copy with the whole batch."""
    from parascale.script import launch

    cfg, size = launch.checked({"sync": "reduce-broadcast", "workers": 2})
    assert (cfg.strategy.sync, size) == ("reduce-broadcast", 2)


def test_an_unknown_strategy_is_one_line(tmp_path, capsys):
    assert "unknown --sync 'bogus'" in refused(capsys, tmp_path, "--sync", "bogus", str(SCRIPT))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpus_without_cuda_is_one_line(tmp_path, capsys):
    assert "needs CUDA" in refused(capsys, tmp_path, "--gpus", "0", str(SCRIPT))


def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    assert main(["run", "--out", "/proc/parascale-run", str(SCRIPT)]) == 2
    assert "--out /proc/parascale-run" in one_line_error(capsys)


def test_a_strategy_option_is_checked_before_anything_starts(tmp_path, capsys):
    line = refused(capsys, tmp_path, "--sync", "local-sgd", "--compression", "fp16",
                   str(SCRIPT))
    assert "--compression" in line


def changed_lines(before: str, after: str) -> int:
    """Lines of code changed from ``before`` to ``after``, module docstrings aside (a replaced
    line counts once)."""
    def code(text: str) -> list[str]:
        tree = ast.parse(text)
        first = tree.body[1].lineno if ast.get_docstring(tree) else 1
        return text.splitlines()[first - 1:]

    matcher = difflib.SequenceMatcher(None, code(before), code(after), autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
               if tag != "equal")


def test_the_parascale_example_changes_at_most_ten_lines_of_the_plain_one():
    plain = (EXAMPLES / "digits_plain.py").read_text()
    ours = SCRIPT.read_text()
    assert 0 < changed_lines(plain, ours) <= 10
    assert changed_lines(plain, plain) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_both_examples_run_alone_and_the_parascale_one_under_torchrun_too(tmp_path):
    """Alone, the parascale script is one worker with batch B; under torchrun, 2 ranks with
    B/2 each end with its parameters (the world torchrun made was joined, not another)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARASCALE_")}
    env["GLOO_SOCKET_IFNAME"] = "lo"
    args = ["--epochs", "1"]
    plain = subprocess.run([sys.executable, str(EXAMPLES / "digits_plain.py"), *args,
                            "--save", str(tmp_path / "plain.pt")], env=env, capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    alone = subprocess.run([sys.executable, str(SCRIPT), *args, "--batch-size", "32", "--save",
                            str(tmp_path / "alone.pt")], env=env, capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode == 0, alone.stderr
    assert "epoch 1:" in plain.stdout and "epoch 1:" in alone.stdout
    out = tmp_path / "torchrun"
    joined = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
         "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m",
         "parascale", "run", "--timeout", "60", "--out", str(out), str(SCRIPT), *args,
         "--batch-size", "16"], env=env, capture_output=True, text=True, timeout=300)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "ok" and record["environment"]["launcher"] == "torchrun"
    assert record["derived"]["world_size"] == 2 and record["derived"]["per_device_batch"] == 16
    assert_same(torch.load(tmp_path / "alone.pt")["model"], torch.load(out / "model.pt"))
    assert "epoch 1: loss" in (out / "log.txt").read_text()


@pytest.mark.slow
def test_local_sgd_runs_a_script_and_its_checkpoint_comes_back(tmp_path):
    """--sync local-sgd through the API (its averages recorded), and run.save/run.load: rank
    0 writes, every rank reads back the parameters it had (the last step averaged them)."""
    from test_script_failures import write_script

    from parascale.script.launch import run  # parascale run from Python, as a study calls it

    out = tmp_path / "run"
    checkpoint = tmp_path / "state.pt"
    record = run({"workers": 2, "sync": "local-sgd", "period": 2, "timeout": 60.0,
                  "out": str(out)}, write_script(tmp_path), ["ok", str(checkpoint)])
    assert record["status"] == "ok", record["reason"]
    assert json.loads((out / "record.json").read_text()) == record
    # 64 samples, 2 x 8 per step: 4 steps, averaged every 2nd
    assert record["config"]["sync"] == "local-sgd" and record["sync"]["averages"] == 2
    saved = torch.load(checkpoint)
    assert set(saved) == {"model", "optimizer", "step"} and saved["step"] == 8


def test_after_a_double_dash_every_argument_is_the_script_s():
    from parascale.cli.main import build_parser
    from parascale.cli.parsers import script_args

    argv = ["run", "--workers", "2", str(SCRIPT), "--", "--workers", "3"]
    command = build_parser(argv).parse_args(argv).command
    assert command[0] == str(SCRIPT) and script_args(SCRIPT, command[1:]) == ["--workers", "3"]
    assert script_args(SCRIPT, ["--epochs", "1", "--"]) == ["--epochs", "1", "--"]


def test_no_script_at_all_is_one_line(tmp_path, capsys):
    assert "give the script to run" in refused(capsys, tmp_path)
