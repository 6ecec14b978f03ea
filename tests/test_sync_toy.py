"""A strategy is one file and one registry line (issue 31): a strategy of the tests' own
(tests/toy_strategy.py), registered with ``sync.register(Toy)`` and nothing else, is seen for
real by train (on worker processes, which get it from the launch), run, find-batch, bench,
report and predict, through the traits, options and pattern it declares."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import STEPS, assert_same, run_training
from parascale import sync
from parascale.cli.main import main
from toy_strategy import Toy

pytestmark = pytest.mark.slow  # every test here starts worker processes

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "digits_parascale.py"


@pytest.fixture
def toy():
    sync.register(Toy)  # the one registry line
    yield
    sync.unregister(Toy.name)


def test_train_runs_it_and_two_workers_end_as_one_with_the_whole_batch(tmp_path, toy, capsys):
    _, single = run_training(tmp_path / "one", workers=1, global_batch=32, **STEPS)
    out = tmp_path / "two"
    assert main(["train", "--sync", "toy", "--sync-option", "pieces=2", "--workers", "2",
                 "--global-batch", "32", "--steps", "6", "--lr", "0.1", "--momentum", "0.9",
                 "--weight-decay", "1e-4", "--seed", "3", "--model", "smallcnn",
                 "--dataset", "digits", "--timeout", "60", "--out", str(out)]) == 0
    record = json.loads((out / "record.json").read_text())
    assert record["config"]["sync"] == "toy" and record["config"]["pieces"] == 2
    assert record["derived"]["sync_options"] == {"pieces": 2}
    assert record["derived"]["bytes_per_step"] > 0
    assert_same(torch.load(out / "model.pt"), single)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "toy" in help_text and "pieces (--sync toy, int, default 1)" in help_text


def test_run_runs_a_script_under_it(tmp_path, toy, capfd):
    out = tmp_path / "script"
    assert main(["run", "--workers", "2", "--sync", "toy", "--sync-option", "pieces=3",
                 "--timeout", "60", "--out", str(out), str(SCRIPT), "--epochs", "1",
                 "--batch-size", "16"]) == 0, capfd.readouterr().err
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "ok" and record["config"]["sync"] == "toy"
    assert record["derived"]["sync_options"] == {"pieces": 3}


def test_find_batch_probes_with_it(tmp_path, toy):
    out = tmp_path / "found.json"
    assert main(["find-batch", "--model", "mlp", "--dataset", "digits", "--sync", "toy",
                 "--workers", "2", "--memory-limit", "64G", "--max-batch", "4",
                 "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert (found["sync"], found["workers"], found["batch"]) == ("toy", 2, 4)
    assert found["sync_options"] == {"pieces": 1}


def test_bench_report_and_predict_take_its_records(tmp_path, toy, capsys):
    study = tmp_path / "study"
    assert main(["bench", "--model", "mlp", "--dataset", "digits", "--sync", "toy",
                 "--scaling", "weak", "-V", "workers=1,2", "--batch-size", "16", "--steps",
                 "8", "--threads", "1", "--no-save-model", "--timeout", "60",
                 "--out", str(study)]) == 0
    capsys.readouterr()
    assert main(["report", str(study), "--out", str(tmp_path / "report")]) == 0
    assert "sync toy" in capsys.readouterr().out  # not the default: the title says which
    assert main(["predict", str(study), "--interconnect", "loopback",
                 "--workers", "1,2,8"]) == 0
    printed = capsys.readouterr().out
    assert "--sync toy" in printed and "toy (ring allreduce, after backward)" in printed
    # the gradient's size: the 2-worker record's bytes, inverted by the toy's declared pattern
    assert "inverted to the bytes entering the exchange" in printed
