"""``parascale bench --script``: a study whose runs are a user's own script under
``parascale run``, with the contention baseline, resume and the report of any study; and the
input a script's study refuses in one line before anything runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import assert_matches, one_error_line, series
from parascale.cli.main import main
from parascale.report import load_studies, summary_rows

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "digits_parascale.py"


@pytest.mark.slow
def test_a_study_of_the_example_script_reports_speedup_split_and_baseline(tmp_path, capsys):
    study, board = tmp_path / "study", tmp_path / "tb"
    command = ["bench", "--script", str(SCRIPT), "--script-args=--epochs 2 --batch-size 16",
               "--workers", "1,2", "--baseline", "--timeout", "60",
               "--tensorboard", str(board), "--out", str(study)]
    assert main(command) == 0
    printed = capsys.readouterr().out
    runs = sorted(p.name for p in (study / "runs").iterdir())
    assert len(runs) == 3 and runs[2].endswith("-baseline")
    for run in runs:  # each run is the script's, its series in a folder of its own
        record = json.loads((study / "runs" / run / "record.json").read_text())
        assert record["status"] == "ok" and record["script"]["path"] == SCRIPT.name
        assert record["script"]["args"] == ["--epochs", "2", "--batch-size", "16"]
        assert record["config"]["sync"] == ("none" if run.endswith("-baseline") else "allreduce")
        assert_matches(series(board / run), record["epochs"])
    rows = summary_rows(load_studies([study]).records)
    assert [r.workers for r in rows] == [1, 2]
    two = rows[1]
    assert two.speedup is not None and two.efficiency is not None
    assert two.baseline_throughput is not None and two.step_split_s is not None
    assert rows[0].per_device_batch == two.per_device_batch == 16  # the script's own batch
    for words in ("speedup", "efficiency", "baseline samples/s", "data/compute/sync/opt (ms)"):
        assert words in printed, words
    # the same command again resumes: every run is kept, none trains again
    assert main(command) == 0
    assert "3 of 3 runs already done" in capsys.readouterr().out


def refused(capsys, tmp_path, *args: str) -> str:
    out = tmp_path / "study"
    assert main(["bench", "--script", str(SCRIPT), "--workers", "1,2", *args,
                 "--out", str(out)]) == 2
    assert not out.exists()
    return one_error_line(capsys)


def test_a_train_option_that_is_the_scripts_business_is_refused(capsys, tmp_path):
    line = refused(capsys, tmp_path, "--epochs", "3")
    assert "--epochs is the script's own business" in line and "--script-args" in line


def test_scaling_a_script_is_refused_naming_the_scripts_batch(capsys, tmp_path):
    line = refused(capsys, tmp_path, "--scaling", "strong")
    assert "--scaling" in line and "script_args=--batch-size ${b}" in line


def test_a_strategy_the_script_api_cannot_run_is_refused(capsys, tmp_path):
    assert "--sync zero cannot run a script" in refused(capsys, tmp_path, "--sync", "zero")


def test_a_tensorboard_folder_that_cannot_be_made_is_refused(capsys, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    line = refused(capsys, tmp_path, "--tensorboard", str(tmp_path / "file" / "tb"))
    assert "--tensorboard" in line and "not a folder" in line


def test_a_missing_script_is_refused(capsys, tmp_path):
    out = tmp_path / "study"
    assert main(["bench", "--script", str(tmp_path / "none.py"), "--workers", "1",
                 "--out", str(out)]) == 2
    assert "no such script" in one_error_line(capsys) and not out.exists()


def test_a_study_file_names_the_script_and_a_computed_batch(capsys, tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text(f"script: {SCRIPT}\n"
                    "script_args: --epochs 1 --batch-size ${b}\n"
                    "parameters: {b: '$(64 // ${workers})$'}\n"
                    "variables: {workers: [1, 2]}\n")
    assert main(["bench", "--config", str(spec), "--baseline", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "--batch-size 64" in printed and "--batch-size 32" in printed
    assert "baseline" in printed and "nothing was run or written" in printed


def test_the_report_shows_where_the_steady_step_went_by_part(tmp_path):
    from conftest import record

    from helpers import rows_of
    from parascale.report.tables import table

    runs = [record(n, 1000.0 * n) for n in (1, 2)]
    parts = {"data": 0.001, "compute": 0.02, "sync": 0.004, "optimizer": 0.002}
    for run in runs[1:]:  # the 1-worker record is an older one: it timed the whole step only
        run["steps"]["phases"].update({p: {"mean": s} for p, s in parts.items()})
    rows = rows_of(tmp_path, runs)
    assert rows[0].step_split_s is None and rows[1].step_split_s == (0.001, 0.02, 0.004, 0.002)
    headers, cells = table(rows)
    column = headers.index("data/compute/sync/opt (ms)")
    assert [line[column] for line in cells] == ["—", "1.00 / 20.0 / 4.00 / 2.00"]
