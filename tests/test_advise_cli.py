"""``parascale advise`` in-process on figures given by hand (nothing is measured, no process
starts): a cluster it cannot reach, advised with every input marked and a band; and each bad
input refused in one line, exit code 2, nothing written."""
from __future__ import annotations

import json

import pytest

from conftest import one_line_error
from parascale.cli.main import main

JOB = ["--model", "resnet20", "--dataset", "cifar10", "--data-dir", "/no/such/data",
       "--batch-size", "128", "--lr", "0.1", "--target-accuracy", "0.9", "--epochs", "100"]
CLUSTER = ["--nodes", "8", "--gpus-per-node", "8", "--interconnect", "ib100",
           "--device-memory", "80GiB", "--gpu", "H100"]
GIVEN = ["--noise-scale", "2000", "--noise-scale-se", "300", "--steps-to-target", "20000",
         "--params", "0.27M", "--flops-per-sample", "0.12G", "--train-samples", "50000",
         "--activations-per-sample", "1M"]


def test_a_cluster_it_cannot_reach_gets_a_recommendation_with_every_input_marked(
        tmp_path, capsys):
    out = tmp_path / "advice"
    code = main(["advise", *JOB, *CLUSTER, *GIVEN, "--strategies", "allreduce,zero,local-sgd",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    inputs = text.split("inputs (how each is known):")[1].split("searched:")[0]
    for mark in ("[given]", "[assumed]", "[counted]"):
        assert mark in inputs
    assert "utilisation (MFU) = 0.4 of the peak (0.2 to 0.6)  [assumed]" in inputs
    assert "noise scale B_noise = 2000 samples (1700 to 2300)  [given]" in inputs
    assert "recommended (fastest to the goal):" in text and "on 64 devices" not in inputs
    assert "what limits it:" in text
    advice = json.loads((out / "advice.json").read_text())  # strict JSON: no Infinity, no NaN
    best = advice["recommended"]
    assert best["low_s"] < best["time_s"] < best["high_s"]
    assert best["exact_steps"]  # steps on the global batch's mean gradient
    assert {i["how"] for i in advice["inputs"]} >= {"given", "assumed", "counted"}
    assert (out / "advice.csv").read_text().count("\n") == len(advice["candidates"]) + 1
    assert (out / "advice.png").read_bytes()[:4] == b"\x89PNG"
    assert "--batch-size" in best["command"] and "--workers" not in best["command"]


def refused(capsys, tmp_path, *args: str) -> str:
    out = tmp_path / "advice"
    code = main(["advise", *args, "--out", str(out)])
    line = one_line_error(capsys)
    assert code == 2 and line.startswith("parascale: error:"), line
    assert not out.exists()
    return line


@pytest.mark.parametrize("args, words", [
    ([*JOB[:-4], "--target-metric", "bleu", "--target-value", "30", *CLUSTER, *GIVEN],
     "'bleu' is not a metric of this task; its metrics: loss, accuracy"),
    ([*JOB, *CLUSTER, *GIVEN[:4], "--steps-to-target", "90000", *GIVEN[6:]],
     "cannot reach its target within it"),
    ([*JOB, *CLUSTER, *GIVEN[:6], "--params", "10000G", *GIVEN[8:]],
     "no device fits the model even sharded"),
    ([*JOB, *CLUSTER, "--workers", "2", *GIVEN], "contradict each other"),
    ([*JOB, "--gpu", "H100", *GIVEN], "--gpu describes a cluster's devices"),
    ([*JOB[:-4], "--epochs", "100", *CLUSTER, *GIVEN[:4], *GIVEN[6:]], "give the goal"),
    ([*JOB, *CLUSTER, *GIVEN, "--budget-samples", "1M"], "not both"),
    ([*JOB, *CLUSTER[:-2], *GIVEN], "needs its devices' speed"),
    ([*JOB, *CLUSTER, *GIVEN, "--sync", "zero"], "unrecognized arguments"),
    ([*JOB, *CLUSTER, *GIVEN, "--strategies", "nosuch"], "unknown --sync 'nosuch'"),
    ([*JOB, *CLUSTER, *GIVEN, "--noise-scale-se", "-1"], "--noise-scale-se must be 0 or more"),
    ([*JOB, *CLUSTER[:6], "--device-memory", "lots", *CLUSTER[8:], *GIVEN],
     "--device-memory: expected GiB or"),
    ([*JOB, *CLUSTER, *GIVEN, "--verify", "1"], "--verify runs the configurations here"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, tmp_path, args, words):
    assert words in refused(capsys, tmp_path, *args)


def test_an_unknown_gpu_lists_the_known_ones(capsys, tmp_path):
    line = refused(capsys, tmp_path, *JOB, *CLUSTER[:-1], "Z80", *GIVEN)
    assert "--gpu 'Z80'" in line and "H100" in line


def test_records_of_the_job_on_the_clusters_device_replace_its_flops(tmp_path, capsys):
    from conftest import write_study
    from test_predict_cli import run_record

    study = write_study(tmp_path / "one-gpu", [run_record(1, device="cuda")])  # 30 ms at b=32
    flops = main(["advise", *JOB, *CLUSTER, *GIVEN, "--strategies", "allreduce", "--out",
                  str(tmp_path / "flops")])
    measured = main(["advise", *JOB, *CLUSTER[:-2], "--records", str(study), *GIVEN,
                     "--strategies", "allreduce", "--out", str(tmp_path / "records")])
    text = capsys.readouterr().out.split("parascale advise:")[-1]
    assert flops == measured == 0
    assert "compute(b) = 30 ms at b=32  [measured]" in text and "MFU" not in text

    def band(folder: str) -> float:
        best = json.loads((tmp_path / folder / "advice.json").read_text())["recommended"]
        return best["high_s"] / best["low_s"]

    assert band("records") < band("flops")  # measured work: a tenth, not half, either way
