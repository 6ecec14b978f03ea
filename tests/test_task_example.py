"""The README's regression task (examples/regression.py), from the example alone: it trains on
2 workers, runs a study whose report speaks its unit and metric, and a search minimising its
metric; a study file names it with ``task:``."""
import csv
import json
from pathlib import Path

import pytest

from parascale.cli.main import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def in_examples(monkeypatch):
    monkeypatch.chdir(EXAMPLES)  # the README runs the example in its folder


def test_a_study_file_names_the_task(tmp_path, in_examples, capsys):
    study = tmp_path / "study.yaml"
    study.write_text("parameters:\n  task: regression:task\n  epochs: 2\n  batch_size: 16\n"
                     "  scaling: weak\nvariables:\n  workers: [1, 2]\n")
    out = tmp_path / "out"
    assert main(["bench", "--config", str(study), "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 runs: 2 planned" in text and "task=regression:task" in text
    assert not out.exists()


@pytest.mark.slow
def test_the_example_runs_a_study_with_its_report(tmp_path, in_examples, capsys):
    out = tmp_path / "study"
    assert main(["bench", "--task", "regression:task", "--workers", "1,2", "--scaling", "weak",
                 "--batch-size", "32", "--epochs", "2", "--target-metric", "mae",
                 "--target-value", "0.5", "--out", str(out)]) == 0
    records = [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/record.json"))]
    assert sorted(r["derived"]["world_size"] for r in records) == [1, 2]
    for record in records:
        # the task brought its own model and data: the built-in defaults did not run
        assert record["config"]["task"] == "regression:task"
        assert record["config"]["model"] is None and record["config"]["dataset"] is None
        assert record["task"]["judge"] == "mae"
        assert {"name": "mae", "higher_is_better": False} in record["task"]["metrics"]
        assert record["time_to_accuracy"]["metric"] == "mae"
        assert "test_mae" in record["epochs"][-1] and "test_mae" in record["summary"][
            "final_metrics"]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "regression:task on its own data" in text
    assert "samples/s" in text and "test mae" in text and "time to mae ≤ 0.5" in text
    # the report recomputes the time to another value of the metric from the recorded curves
    assert main(["report", str(out), "--target-metric", "mae", "--target-value", "100",
                 "--out", str(tmp_path / "again")]) == 0
    assert "time to mae ≤ 100" in capsys.readouterr().out
    # the same study again keeps every run it has (the plan and the records agree)
    assert main(["bench", "--task", "regression:task", "--workers", "1,2", "--scaling", "weak",
                 "--batch-size", "32", "--epochs", "2", "--target-metric", "mae",
                 "--target-value", "0.5", "--out", str(out)]) == 0
    assert "2 of 2 runs already done" in capsys.readouterr().out


@pytest.mark.slow
def test_a_search_minimises_the_tasks_metric(tmp_path, in_examples, capsys):
    out = tmp_path / "hpo"
    assert main(["hpo", "--task", "regression:task", "--objective", "mae", "--trials", "2",
                 "--epochs", "2", "--param", "lr=0.001:0.1:log", "--optimizer", "adamw",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "validation mae" in text and "test mae" in text
    with (out / "trials.csv").open() as table:
        rows = list(csv.DictReader(table))
    values = [float(row["value"]) for row in rows]
    # the table's validation column is the objective's metric, filled (not a blank 'val acc')
    assert "val mae" in text and all(row["val_best"] == row["value"] for row in rows)
    best = json.loads((out / "best.json").read_text())
    assert best["value"] == min(values)  # minimised: lower is better for mae
    assert best["test_metrics"]["mae"] > 0


def test_a_slurm_job_script_trains_the_task(tmp_path, in_examples, capsys):
    out = tmp_path / "run"
    assert main(["slurm", "train", "--task", "regression:task", "--workers", "2", "--nodes", "1",
                 "--time", "10", "--epochs", "2", "--out", str(out), "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "parascale train regression:task, 2 worker(s)" in script
    # the srun line wraps where this checkout's path makes it long: join it before looking
    assert "train --task regression:task" in " ".join(script.replace("\\\n", " ").split())
    assert main(["slurm", "train", "--task", "regression:nope", "--workers", "2", "--nodes",
                 "1", "--time", "10", "--out", str(out), "--dry-run"]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err
