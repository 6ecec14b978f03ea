"""The seeds' studies in examples/ plan here as they are (their GPUs aside), and batch_size max
in a study file is searched per model when the study runs, never in a dry run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from parascale.cli.main import main
from data_files import write_cifar

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_dlbs_weak_scaling_example_plans(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["bench", "--config", str(EXAMPLES / "dlbs-weak-scaling.yaml"), "--dry-run",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3 runs: 3 planned, 0 skipped" in text
    for n in (1, 2, 4):  # weak scaling: 16 per GPU
        assert any(line.split()[1:3] == [str(n), str(16 * n)] for line in text.splitlines()
                   if line.startswith(f"workers-{n}_"))
    assert "model=resnet50" in text and "steps=200" in text
    assert "which this machine does not have" in text
    assert not out.exists()


def test_the_bsc_example_plans_each_model_at_its_own_largest_batch(tmp_path, capsys):
    write_cifar(tmp_path / "data")
    out = tmp_path / "study"
    assert main(["bench", "--config", str(EXAMPLES / "bsc-resnet-v2.yaml"), "-P",
                 f"data_dir={tmp_path / 'data'}", "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "6 runs: 6 planned, 0 skipped" in text
    assert "batch_size max: the batch search runs for each model when the study runs" in text
    assert "timm:resnetv2_50" in text and "timm:resnetv2_152" in text
    assert "image_size=128" in text and "lr_scaling=linear" in text
    assert not out.exists()


def test_a_bad_example_override_is_one_line(tmp_path, capsys):
    assert main(["bench", "--config", str(EXAMPLES / "bsc-resnet-v2.yaml"), "-P",
                 f"data_dir={tmp_path / 'none'}", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cifar-10-batches-py" in err[0]


def test_batch_size_max_needs_a_per_device_batch(tmp_path, capsys):
    assert main(["bench", "--model", "mlp", "--batch-size", "max", "--scaling", "strong",
                 "--global-batch", "64", "--workers", "1,2", "--dry-run"]) == 2


@pytest.mark.slow
def test_batch_size_max_in_a_study_file_is_searched_per_model(tmp_path, capsys):
    study_file = tmp_path / "study.yaml"
    study_file.write_text("parameters:\n  dataset: digits\n  batch_size: max\n  epochs: 1\n"
                          "  scaling: weak\n  workers: 1\nvariables:\n  model: [mlp, lenet]\n")
    out = tmp_path / "study"
    assert main(["bench", "--config", str(study_file), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    found = {line.split()[3].rstrip(":"): int(line.split()[4]) for line in text.splitlines()
             if line.startswith("batch_size max for")}
    assert set(found) == {"mlp", "lenet"}
    records = [json.loads(p.read_text()) for p in out.glob("runs/*/record.json")]
    assert {(r["config"]["model"], r["config"]["batch_size"]) for r in records} == \
        set(found.items())
    assert json.loads((out / "plan.json").read_text())["inputs"]["parameters"]["batch_size"] \
        == "max"
