"""``parascale demo --quick``: the built-in study, end to end, and re-used when run again."""
from __future__ import annotations

import json
import re

import pytest

from parascale.cli.main import main

pytestmark = pytest.mark.slow  # every test here starts worker processes


def test_quick_demo_runs_weak_and_strong_scaling_and_resumes(tmp_path, capsys):
    study = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(study)]) == 0
    out = capsys.readouterr().out
    found = [json.loads(p.read_text()) for p in study.glob("runs/*/record.json")]
    assert {(r["study"]["scaling"], r["derived"]["world_size"]) for r in found} >= {
        ("weak", 1), ("strong", 1)}
    assert all(r["status"] == "ok" for r in found)
    assert "weak scaling" in out and "strong scaling" in out
    assert f"report: {study / 'report' / 'report.html'}" in out
    assert (study / "report" / "report.html").is_file()

    assert main(["demo", "--quick", "--out", str(study)]) == 0
    again = capsys.readouterr().out
    assert f"{len(found)} of {len(found)} runs already done" in again
    assert "--rerun always" in again
    # its wall time whole: the start-up (the interpreter, torch, the plan) beside the study
    done = re.fullmatch(r"demo done in ([0-9.]+) s \(start-up ([0-9.]+) s, runs and report "
                        r"([0-9.]+) s\)", again.strip().splitlines()[-1])
    assert done, again.strip().splitlines()[-1]
    whole, startup, study_s = map(float, done.groups())
    assert startup > 0 and whole == pytest.approx(startup + study_s, abs=0.11)
