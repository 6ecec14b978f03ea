"""``parascale predict`` on a real tiny study made by ``bench`` (1 and 2 workers): the records
that training writes carry everything the model needs, and the study's points are compared."""
from __future__ import annotations

import json

import pytest

from parascale.cli.main import main
from parascale.predict import Options, gradient, predict

pytestmark = pytest.mark.slow


def test_predict_a_real_study(tmp_path, capsys):
    study = tmp_path / "study"
    assert main(["bench", "--model", "smallcnn", "--dataset", "digits", "--scaling", "weak",
                 "-V", "workers=1,2", "--batch-size", "16", "--steps", "12", "--threads", "1",
                 "--no-save-model", "--out", str(study)]) == 0
    capsys.readouterr()
    out = tmp_path / "pred"
    assert main(["predict", str(study), "--interconnect", "loopback", "--workers", "1,2,8",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[measured]" in printed and "[assumed]" in printed
    data = json.loads((out / "prediction.json").read_text())
    measured = {m["workers"]: m for m in data["measured"]}
    assert sorted(measured) == [1, 2]
    assert measured[1]["error_pp"] == pytest.approx(0.0)
    assert 0 < measured[2]["predicted_efficiency"] < 1  # loopback's exchange costs something
    # the bytes the 2-worker record says it sent are the model's parameters, counted
    pred = predict(Options([str(study)], interconnect="loopback", workers=(1, 2)))
    assert pred.model.gradient_bytes == gradient.count_parameters("smallcnn", 10, (1, 8, 8)) * 4
