"""A study killed mid-run resumes: no record lost, none duplicated, none half-written."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # a real study, killed and run again


def test_study_killed_mid_run_resumes_where_it_stopped(tmp_path):
    study = tmp_path / "study"
    command = [sys.executable, "-m", "parascale", "bench", "--model", "mlp", "--dataset",
               "digits", "--workers", "1", "-V", "batch_size=8,16,32", "--epochs", "1",
               "--timeout", "60", "--out", str(study)]
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

    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 of 3 runs already done" in done.stdout, done.stdout

    plan = json.loads((study / "plan.json").read_text())
    folders = sorted(run["folder"] for run in plan["runs"])
    found = sorted(p.parent.name for p in study.glob("runs/*/record.json"))
    assert found == folders and len(found) == 3, done.stdout  # each configuration exactly once
    for folder in found:
        record = json.loads((study / "runs" / folder / "record.json").read_text())
        assert record["status"] == "ok", record["reason"]
        assert record["study"]["config_id"] == folder
    assert (first.stat().st_mtime_ns,
            json.loads(first.read_text())["environment"]["start_time"]) == before
    assert not list(study.rglob("*.tmp")) and not (study / ".running").exists()
    assert sorted(p.name for p in study.iterdir()) == [".lock", "plan.json", "report", "runs",
                                                        "summary.txt"]
