"""--tensorboard DIR: the run's figures as TensorBoard event files, written by torch's own
SummaryWriter on rank 0, one scalar series per metric and per part of the step, read back here
with TensorBoard's own reader and checked against record.json. A folder that cannot be written
is one line, exit 2, before anything runs."""
from __future__ import annotations

import pytest

from conftest import run_training
from helpers import assert_matches, one_error_line, series
from parascale.cli.main import main
from parascale.training.observe.tensorboard import TensorBoardWriter

PARTS = {"step_time/data", "step_time/compute", "step_time/sync", "step_time/optimizer",
         "step_time/step"}


def test_an_epoch_entry_becomes_one_series_per_figure_and_step_part(tmp_path):
    entry = {"epoch": 3, "warmup": False, "steps": 5, "samples": 320, "partial": False,
             "train_loss": 1.5, "test_loss": 1.25, "test_accuracy": 0.5, "val_mae": 0.125,
             "throughput": 640.0, "lr": 0.1, "wall_time_s_per_rank": [0.5, 0.5],
             "noise_scale": None, "step_split_s": {"data": 0.01, "compute": 0.05, "sync": 0.02,
                                                   "optimizer": 0.005, "step": 0.085}}
    writer = TensorBoardWriter(str(tmp_path))
    writer.epoch(entry)
    writer.close()
    found = series(tmp_path)
    assert set(found) == {"train/loss", "test/loss", "test/accuracy", "val/mae",
                          "run/throughput", "run/lr"} | PARTS
    assert found["test/accuracy"] == {3: 0.5}
    assert found["step_time/sync"] == {3: pytest.approx(0.02)}


def test_an_unwritable_tensorboard_folder_is_refused_in_one_line(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "taken").write_text("a file, not a folder")
    board = locked / "taken" / "tb"
    code = main(["train", "--model", "mlp", "--workers", "1", "--steps", "1",
                 "--out", str(tmp_path / "run"), "--tensorboard", str(board)])
    assert code == 2
    line = one_error_line(capsys)
    assert f"--tensorboard {board}" in line and "not a folder" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_two_workers_write_the_records_figures_as_series_on_rank_0(tmp_path):
    board = tmp_path / "tb"
    record, _ = run_training(tmp_path / "run", model="mlp", workers=2, global_batch=256,
                             epochs=2, tensorboard=str(board))
    files = list(board.iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents.")  # rank 0 alone
    found = series(board)
    assert PARTS | {"train/loss", "test/accuracy", "run/throughput"} <= set(found)
    assert_matches(found, record["epochs"])
    split = record["epochs"][1]["step_split_s"]  # the step is the sum of its parts
    assert split["step"] == pytest.approx(sum(split[p] for p in ("data", "compute", "sync",
                                                                 "optimizer")))


def test_a_studys_folder_for_series_changes_none_of_its_configurations(tmp_path, capsys):
    study = ["bench", "--model", "mlp", "--steps", "2", "--workers", "1", "-V", "lr=0.05,0.1",
             "--dry-run", "--out", str(tmp_path / "study")]
    plans = []
    for extra in ([], ["--tensorboard", str(tmp_path / "tb")]):
        assert main([*study, *extra]) == 0
        plans.append([line.split()[0] for line in capsys.readouterr().out.splitlines()
                      if line.startswith("lr-")])
    assert len(plans[0]) == 2 and plans[0] == plans[1]  # the same runs, in the same folders
    assert main([*study, "-P", f"tensorboard={tmp_path / 'tb'}"]) == 2
    assert "give --tensorboard DIR" in one_error_line(capsys)


def test_a_searchs_folder_for_series_is_no_part_of_what_it_searches():
    from parascale.hpo.study import _comparable, identity

    plain = identity("accuracy", None, [], {"model": "mlp"})
    shown = identity("accuracy", None, [], {"model": "mlp", "tensorboard": "tb/search"})
    assert _comparable(plain) == _comparable(shown)  # resuming with --tensorboard is allowed
