"""``parascale advise`` measuring here and grading itself, on a tiny job: the pilot, the
probes, the baseline and the link measured as a short study (how long each took said), the
advice made from them with every input marked, and ``--verify 1`` running the recommendation
and the next configuration and setting the measured time beside the predicted one. Nothing
is timed."""
from __future__ import annotations

import json

import pytest

from parascale.cli.main import main

pytestmark = pytest.mark.slow

TINY = ["--model", "mlp", "--dataset", "digits", "--batch-size", "32", "--lr", "0.05",
        "--target-metric", "loss", "--target-value", "0.6", "--epochs", "6", "--workers", "2",
        "--strategies", "allreduce", "--exact-only", "--batch-sizes", "16,32",
        "--probe-steps", "10", "--timeout", "120"]


def test_advise_measures_here_and_verifies_its_recommendation(tmp_path, capsys):
    out = tmp_path / "advice"
    # the noise scale given: a measured one may be too imprecise to recommend from, which
    # withholds the recommendation (tests/test_advise_model.py) and so the verification
    code = main(["advise", *TINY, "--noise-scale", "60", "--verify", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    measured = text.split("measured here:")[1].split("inputs (how each")[0]
    assert "the runs: 4 run(s)" in measured and " s;" in measured  # pilot, 2 probes, baseline
    assert "the link: parascale comm on 2 workers" in measured
    inputs = text.split("inputs (how each is known):")[1].split("searched:")[0]
    assert "compute(b) = " in inputs and "[fitted] least squares over 2 probes" in inputs
    assert "compute at N=2 = " in inputs and "contention baseline" in inputs
    assert "steps to the target = " in inputs and "[measured] the pilot at global batch 32" \
        in inputs
    assert "link = measured" in inputs
    assert "recommended (fastest to the goal):" in text
    assert "predicted against measured time to the goal (this machine):" in text
    advice = json.loads((out / "advice.json").read_text())
    checks = advice["checks"]
    assert len(checks) == 2 and checks[0]["recommended"]
    assert all(c["status"] == "ok" for c in checks)
    assert all(c["measured_s"] is None or c["measured_s"] > 0 for c in checks)
    assert (out / "measure" / "runs").is_dir() and (out / "verify" / "runs").is_dir()
    # measured once: a second advice of the same job keeps the runs
    assert main(["advise", *TINY, "--noise-scale", "60", "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert "4 of 4 runs already done" in again
