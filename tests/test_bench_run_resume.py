"""A study killed mid-run resumes: no record lost, none duplicated, none half-written."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from parascale.cli.main import main

pytestmark = pytest.mark.slow  # a real study, killed and run again


def test_study_killed_mid_run_resumes_where_it_stopped(tmp_path, capsys):
    study = tmp_path / "study"
    args = ["bench", "--model", "mlp", "--dataset", "digits", "--workers", "1", "-V",
            "batch_size=8,16,32", "--epochs", "1", "--timeout", "60", "--out", str(study)]
    command = [sys.executable, "-m", "parascale", *args]
    # a session of its own, so that SIGKILL takes the training workers down too (a crash)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(study.glob("runs/*/record.json")):
            assert proc.poll() is None, "the study ended before it could be killed"
            assert time.monotonic() < deadline, "no record within 120 s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (first,) = study.glob("runs/*/record.json")  # killed during the second run
    before = (first.stat().st_mtime_ns, json.loads(first.read_text())["environment"]["start_time"])

    # the same command again, in this process (its fork server is warm): the study's folder,
    # as the crash left it, is what is resumed
    capsys.readouterr()
    assert main(args) == 0
    done = capsys.readouterr()
    assert "1 of 3 runs already done" in done.out, done.out

    plan = json.loads((study / "plan.json").read_text())
    folders = sorted(run["folder"] for run in plan["runs"])
    found = sorted(p.parent.name for p in study.glob("runs/*/record.json"))
    assert found == folders and len(found) == 3, done.out  # each configuration exactly once
    for folder in found:
        record = json.loads((study / "runs" / folder / "record.json").read_text())
        assert record["status"] == "ok", record["reason"]
        assert record["study"]["config_id"] == folder
    assert (first.stat().st_mtime_ns,
            json.loads(first.read_text())["environment"]["start_time"]) == before
    assert not list(study.rglob("*.tmp")) and not (study / ".running").exists()
    assert sorted(p.name for p in study.iterdir()) == [".lock", "plan.json", "report", "runs",
                                                        "summary.txt"]


@pytest.mark.slow
def test_a_changed_plan_in_a_reused_folder_is_said_and_kept_apart(tmp_path, capsys):
    study = tmp_path / "reused"
    base = ["bench", "--model", "mlp", "--workers", "1", "--steps", "2", "--timeout", "60",
            "--out", str(study)]
    assert main(base + ["--batch-size", "8"]) == 0
    capsys.readouterr()
    assert main(base + ["--batch-size", "16"]) == 0  # another plan, same folder
    out = capsys.readouterr().out
    assert "held a different plan" in out and "kept apart" in out, out
    summary = (study / "summary.txt").read_text()
    assert "batch 8 per device" not in summary and "batch 16 per device" not in summary
    assert "Not in this study's plan" in summary
    page = (study / "report" / "report.html").read_text()
    assert "Not in this study&#x27;s plan" in page
    planned = {r["folder"] for r in json.loads((study / "plan.json").read_text())["runs"]}
    assert len(planned) == 1 and len(list(study.glob("runs/*/record.json"))) == 2

    # growing the plan (a second repeat) resumes: the recorded run is kept
    assert main(base + ["--batch-size", "16", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "the plan grew" in out and "1 of 2 runs already done" in out, out
