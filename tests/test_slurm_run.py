"""parascale slurm run (and slurm bench --script) without a cluster: the job script runs
'parascale run' on every task with run's own options, the script and its arguments as given;
what a script's job cannot take is one line, nothing written. (A real job: test_slurm_cluster.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import one_error_line, srun_words
from parascale.cli.main import main
from parascale.cluster import scheduler

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "digits_parascale.py"


@pytest.fixture(autouse=True)
def no_sinfo(monkeypatch):
    """The fast tier starts no process: plan studies against this machine's cores."""
    monkeypatch.setattr(scheduler, "cpus_per_node", lambda partition: None)


def test_a_scripts_job_runs_parascale_run_on_every_task(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["slurm", "run", "--workers", "4", "--nodes", "2", "--sync", "local-sgd",
                 "--period", "4", "--tensorboard", str(tmp_path / "tb"), "--out", str(out),
                 "--dry-run", str(SCRIPT), "--epochs", "2", "--timeout", "9"]) == 2
    assert "--timeout comes after digits_parascale.py" in one_error_line(capsys)
    assert main(["slurm", "run", "--workers", "4", "--nodes", "2", "--sync", "local-sgd",
                 "--period", "4", "--tensorboard", str(tmp_path / "tb"), "--out", str(out),
                 "--dry-run", str(SCRIPT), "--", "--epochs", "2", "--timeout", "9"]) == 0
    words = srun_words(capsys.readouterr().out)
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing
    ran = words[words.index("run") + 1:]
    assert ran == ["--workers", "4", "--threads", "1", "--sync", "local-sgd", "--period", "4",
                   "--tensorboard", str(tmp_path / "tb"), "--out", str(out), str(SCRIPT),
                   "--", "--epochs", "2", "--timeout", "9"]


@pytest.mark.parametrize("args, words", [
    (["--nodes", "2"], "--nodes comes after digits_parascale.py, so it would go to the script"),
    (["--sync", "zero"], "--sync zero cannot run a script"),
])
def test_what_a_scripts_job_cannot_take_is_one_line(tmp_path, capsys, args, words):
    out = tmp_path / "run"
    before, after = (args, []) if args[0] == "--sync" else ([], args)
    assert main(["slurm", "run", *before, "--out", str(out), "--dry-run", str(SCRIPT),
                 *after]) == 2
    assert words in one_error_line(capsys) and not out.exists()


def test_a_study_of_a_script_on_slurm_runs_it_in_each_job(tmp_path, capsys):
    study = tmp_path / "study"
    board = tmp_path / "tb"
    assert main(["slurm", "bench", "--script", str(SCRIPT), "--script-args=--epochs 1",
                 "--workers", "1,2", "--baseline", "--tensorboard", str(board),
                 "--out", str(study), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    jobs = printed.split("# ---- ")[1:]
    assert len(jobs) == 3 and not study.exists()
    for job in jobs:
        words = srun_words(job)
        ran = words[words.index("run") + 1:]
        assert ran[-4:] == [str(SCRIPT), "--", "--epochs", "1"]
        assert "--no-save-model" not in ran  # train's option, which run does not take
        folder = ran[ran.index("--out") + 1].rsplit("/", 1)[1]  # .running/<configuration>
        assert ran[ran.index("--tensorboard") + 1] == str(board / folder)
    assert "--sync none" in " ".join(srun_words(jobs[2]))  # the baseline: no exchange
