"""--tensorboard DIR: the run's figures as TensorBoard event files, written by torch's own
SummaryWriter on rank 0, one scalar series per metric and per part of the step, read back here
with TensorBoard's own reader and checked against record.json. A folder that cannot be written
is one line, exit 2, before anything runs."""
from __future__ import annotations

import json

import pytest

from conftest import fill_disk, run_training
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


ENTRY = {"epoch": 1, "train_loss": 1.5, "test_accuracy": 0.5,
         "step_split_s": {"data": 0.01, "compute": 0.05, "sync": 0.02, "optimizer": 0.005,
                          "step": 0.085}}


def said_once(capsys) -> str:
    """The one line on stderr, with no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    (line,) = err.strip().splitlines()
    return line


# TensorBoard's writer thread printing its traceback: pytest catches it as this warning
THREAD_TRACEBACK = "error::pytest.PytestUnhandledThreadExceptionWarning"


@pytest.mark.filterwarnings(THREAD_TRACEBACK)
def test_a_full_disk_costs_the_series_not_the_run(small_disk, capsys):
    """TensorBoard's writer thread meets the full disk; the run is told once, in one line naming
    the file and the option, and goes on without its series (the record keeps every figure)."""
    board = small_disk / "tb"
    writer = TensorBoardWriter(str(board))
    writer.epoch(ENTRY)
    (events,) = board.iterdir()
    fill_disk(small_disk)
    capsys.readouterr()
    for epoch in range(2, 40):  # the event file's last page fills after a few epochs
        writer.epoch({**ENTRY, "epoch": epoch})
    writer.close()
    line = said_once(capsys)
    assert line.startswith(f"parascale: warning: --tensorboard {board}: cannot write {events} "
                           "(no space left on device)"), line
    assert line.endswith("the run goes on without its TensorBoard series; the record keeps "
                         "every figure"), line
    assert series(board)["train/loss"][1] == 1.5  # what was written before stays readable


@pytest.mark.filterwarnings(THREAD_TRACEBACK)
def test_a_tensorboard_folder_on_a_full_disk_is_said_once(small_disk, capsys):
    fill_disk(small_disk)
    writer = TensorBoardWriter(str(small_disk / "tb"))
    writer.epoch(ENTRY)
    writer.close()
    line = said_once(capsys)
    assert line.startswith(f"parascale: warning: --tensorboard {small_disk / 'tb'}: cannot "
                           "write "), line


@pytest.mark.slow
def test_a_run_whose_series_do_not_fit_keeps_training_and_its_record(tmp_path, small_disk, capfd):
    board = small_disk / "tb"
    fill_disk(small_disk)
    capfd.readouterr()
    code = main(["train", "--model", "mlp", "--workers", "1", "--steps", "3", "--timeout", "60",
                 "--out", str(tmp_path / "run"), "--tensorboard", str(board)])
    out, err = capfd.readouterr()
    assert code == 0 and "Traceback" not in out + err, err
    said = [line for line in err.splitlines() if "--tensorboard" in line]
    assert len(said) == 1 and said[0].startswith(f"parascale: warning: --tensorboard {board}: "
                                                 "cannot write "), err
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["status"] == "ok" and record["epochs"]
