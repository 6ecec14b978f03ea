"""``find-batch --task`` and ``batch_size: max`` with a task: the probes build the task's own
model and batch its own training items with its own collate (dict items here, which the
registry's random-input probe could not make)."""
from __future__ import annotations

import json

import pytest

from conftest import one_line_error
from parascale.cli.main import main

TASK = '''
from pathlib import Path

import torch
from torch import nn

from parascale.tasks import Task

SEEN = Path(__file__).with_name("collated.txt")


class Items(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": torch.tensor([float(i)])}


def collate(items):
    with SEEN.open("a") as f:  # which batches the probes made, for the test
        f.write(f"{len(items)}\\n")
    return {k: torch.stack([item[k] for item in items]) for k in items[0]}


def loss(model, batch):
    return nn.functional.mse_loss(model(batch["x"]), batch["y"])


def task():
    return Task(train_data=Items(5), eval_data=Items(2), model=lambda: nn.Linear(3, 1),
                loss=loss, collate=collate, name="tiny")
'''


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    (tmp_path / "tinytask.py").write_text(TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_find_batch_probes_the_tasks_own_model_data_and_collate(tiny, capsys):
    out = tiny / "found.json"
    assert main(["find-batch", "--task", "tinytask:task", "--memory-limit", "20G",
                 "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    # five training items: the limit is the task's own training set, and every batch fits
    assert (found["task"], found["batch"], found["limit"]) == ("tinytask:task", 5, 5)
    assert {1, 4, 5} <= {int(n) for n in (tiny / "collated.txt").read_text().split()}
    printed = capsys.readouterr().out
    assert "tinytask:task on its own data" in printed and "largest per-device batch: 5" in printed


def test_find_batch_takes_a_model_or_a_task(capsys, tiny):
    assert main(["find-batch", "--model", "mlp", "--task", "tinytask:task"]) == 2
    assert "--model NAME" in one_line_error(capsys)
    assert main(["find-batch", "--task", "tinytask:nothing"]) == 2
    assert "nothing" in one_line_error(capsys)
    assert not (tiny / "collated.txt").exists()  # refused before any probe


def test_batch_size_max_with_a_task_is_planned(tmp_path, capsys, tiny):
    study = tmp_path / "study.yaml"
    study.write_text("parameters:\n  task: tinytask:task\n  epochs: 1\n  batch_size: max\n"
                     "  scaling: weak\nvariables:\n  workers: [1, 2]\n")
    assert main(["bench", "--config", str(study), "--dry-run", "--out",
                 str(tmp_path / "out")]) == 0
    assert "batch_size max" in capsys.readouterr().out


@pytest.mark.slow
def test_a_study_runs_a_task_at_the_batch_the_search_found(tmp_path, capsys, tiny):
    from parascale.runtime.env import available_cores

    assert main(["bench", "--task", "tinytask:task", "--batch-size", "max", "--scaling", "weak",
                 "--workers", "1", "--epochs", "1", "--out", str(tmp_path / "study")]) == 0
    out = capsys.readouterr().out
    found = int(out.split("batch_size max for tinytask:task: ")[1].split()[0])
    assert found == max(1, 5 // available_cores())  # each worker's share of 5 items
    record = json.loads(next((tmp_path / "study").glob("runs/*/record.json")).read_text())
    assert record["derived"]["per_device_batch"] == found
