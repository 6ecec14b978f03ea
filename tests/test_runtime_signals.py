"""SIGTERM stops a job or a study as Ctrl-C does, changing nothing; a killed launcher's scratch
folders are removed by the next launch. Jobs run in a private TMPDIR, so what they leave is
theirs alone, and every process a test looks at descends from its own launcher."""

import json
import signal
import subprocess

import pytest

from conftest import wait_until
from helpers import alive, began, cli, contents, leftovers, old_results, tree
from parascale.cli.main import main


@pytest.mark.slow
def test_sigterm_stops_the_job_like_ctrl_c_and_changes_nothing(tmp_path):
    out = tmp_path / "runs" / "a"
    before = old_results(out)
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "100000", "--sync",
               "parameter-server", "--out", str(out), tmpdir=tmp_path / "tmp",
               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert began(proc), "training never began"
    procs = tree(proc.pid)  # launcher, fork server, its resource tracker, 2 workers, 1 server
    pids = [p.pid for p in procs]
    assert sorted(p.name() for p in procs if p.name().startswith("parascale-r")) == \
        ["parascale-r0", "parascale-r1"]
    assert sum("parascale.sync.ps_server" in p.cmdline() for p in procs) == 1, procs
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert stderr.strip().splitlines() == ["parascale: terminated (SIGTERM)"], stderr
    assert wait_until(lambda: not alive(pids), 5.0), alive(pids)  # servers die with rank 0
    assert leftovers(tmp_path / "tmp") == []
    assert contents(out) == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["a"]


@pytest.mark.slow
def test_folders_of_a_killed_launcher_are_removed_by_the_next_launch(tmp_path):
    tmpdir = tmp_path / "tmp"
    proc = cli("train", "--workers", "2", "--model", "mlp", "--steps", "100000", "--sync",
               "parameter-server", "--out", str(tmp_path / "run"), tmpdir=tmpdir,
               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert began(proc), "training never began"
    pids = [p.pid for p in tree(proc.pid)]
    proc.kill()
    proc.wait()
    assert wait_until(lambda: not alive(pids), 30.0), alive(pids)
    left = leftovers(tmpdir)
    assert any(n.startswith("parascale-job-") for n in left), left
    assert any(n.startswith("parascale-ps-") for n in left), left
    staging = [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.")]
    assert staging, "the killed run's staging folder"
    again = cli("train", "--workers", "1", "--model", "mlp", "--steps", "1",
                "--no-save-model", "--out", str(tmp_path / "run"), tmpdir=tmpdir,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert again.wait(timeout=300) == 0, again.stderr.read()
    assert leftovers(tmpdir) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "tmp"]


@pytest.mark.slow
def test_sigterm_leaves_a_study_resumable_as_ctrl_c_does(tmp_path, capsys):
    study = tmp_path / "study"
    args = ["bench", "--model", "mlp", "--workers", "1", "-V", "steps=2,200", "--out", str(study)]
    proc = cli(*args, tmpdir=tmp_path / "tmp", fault="slow@0:0.1", stdout=subprocess.DEVNULL,
               stderr=subprocess.PIPE)
    assert wait_until(lambda: len(list(study.glob("runs/*/record.json"))) == 1
                      or proc.poll() is not None, 300.0), "the first run was never filed"
    # the second run is under way: its workers joined (slowed, it takes 20 s more)
    assert wait_until(lambda: joined(study) or proc.poll() is not None, 300.0), \
        "the second run never began"
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    lines = stderr.strip().splitlines()
    assert lines[-1] == "parascale: terminated (SIGTERM)", stderr
    assert lines[-2].startswith(f"interrupted: 1 of 2 runs are recorded in {study}; to resume"), \
        stderr
    assert leftovers(tmp_path / "tmp") == []
    capsys.readouterr()
    assert main(args) == 0  # resumed in this process, whose fork server is warm
    assert "1 of 2 runs already done" in capsys.readouterr().out
    statuses = [json.loads(p.read_text())["status"] for p in study.glob("runs/*/record.json")]
    assert statuses == ["ok", "ok"]


def joined(study) -> bool:
    """Whether a run of ``study`` in progress has its workers (a filed run's folder may go)."""
    for log in study.glob(".running/*/log.txt"):
        try:
            if "worker(s) joined" in log.read_text():
                return True
        except OSError:
            pass
    return False
