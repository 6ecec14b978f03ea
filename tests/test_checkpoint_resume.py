"""A run stopped after a checkpoint in the middle of an epoch, then --resume: it ends with exactly
the parameters of a run that was never stopped (2 gloo workers, digits, deterministic CPU), and
its log.txt tells both halves."""
import json

import pytest
import torch

from conftest import run_training

pytestmark = pytest.mark.slow  # every test here starts worker processes

# digits at global batch 256: 5 steps an epoch. Checkpoints after steps 3 and 6 (epoch 2, after
# its first step); the fault stops the run before step 8, so the resume continues mid-epoch
RUN = dict(workers=2, global_batch=256, steps=8, lr=0.1, momentum=0.9, weight_decay=1e-4,
           seed=3, timeout=30.0)
STRATEGIES = {
    "allreduce": {},
    "local-sgd": {"sync": "local-sgd", "period": 4},  # stopped 2 steps after an average
    "parameter-server": {"sync": "parameter-server"},  # its momentum lives in the servers
}


def same_parameters(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_resumed_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path, monkeypatch,
                                                                   strategy):
    options = {**RUN, **STRATEGIES[strategy]}
    reference, expected = run_training(tmp_path / "whole", **options)

    out = tmp_path / "cut"
    monkeypatch.setenv("PARASCALE_FAULT", "raise@1:8")
    stopped, _ = run_training(out, expect="failed", checkpoint_every=3, **options)
    assert "injected fault on rank 1 at step 8" in stopped["reason"]
    steps = sorted(p.name for p in (out / "checkpoints").glob("*.pt"))
    assert steps == ["step-00000003.pt", "step-00000006.pt"]

    monkeypatch.delenv("PARASCALE_FAULT")  # a new command is attempt 0: the fault would fire
    record, resumed = run_training(out, checkpoint_every=3, resume=True, **options)
    assert same_parameters(resumed, expected)
    assert [e["train_loss"] for e in record["epochs"]] == \
        [e["train_loss"] for e in reference["epochs"]]
    assert [e["test_accuracy"] for e in record["epochs"]] == \
        [e["test_accuracy"] for e in reference["epochs"]]
    # the epoch cut by the checkpoint keeps its steps' gradient norms: the same noise scale
    # (to rounding: DDP's buckets after a restart split the norm's sum differently)
    noise = [e["noise_scale"] for e in reference["epochs"]]
    assert [e["noise_scale"] for e in record["epochs"]] == \
        (pytest.approx(noise, rel=1e-6) if strategy == "allreduce" else [None, None])
    (entry,) = record["resumed"]
    assert (entry["by"], entry["checkpoint"], entry["step"], entry["epoch"]) == \
        ("resume", "checkpoints/step-00000006.pt", 6, 2)
    assert record["epochs"][1]["resumed"] and record["epochs"][1]["warmup"]
    assert record["restarts"] == []
    assert record["checkpoints"]["written"] == 0  # after steps 7 and 8 none is due


def test_log_txt_keeps_what_a_failed_run_and_its_resumption_printed(tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("PARASCALE_FAULT", "raise@1:8")
    run_training(out, expect="failed", checkpoint_every="1e", **RUN)
    failed = (out / "log.txt").read_text()
    assert "parascale: starting 2 workers..." in failed
    assert "epoch 1/2 (warm-up):" in failed and "checkpoint checkpoints/step-00000005.pt" in failed
    assert failed.rstrip().splitlines()[-1].startswith("parascale: failed at ")
    assert "rank 1 failed: RuntimeError: injected fault on rank 1 at step 8" in failed
    assert "\r" not in failed and "%|" not in failed  # no progress bar

    monkeypatch.delenv("PARASCALE_FAULT")
    record, _ = run_training(out, checkpoint_every="1e", resume=True, **RUN)
    whole = (out / "log.txt").read_text()
    assert whole.startswith(failed)  # the same file goes on
    assert "continuing from checkpoints/step-00000005.pt (--resume): step 5 of 8" in whole
    assert "epoch 2/2 (resumed; warm-up; partial, 3 of 5 steps):" in whole
    assert whole.rstrip().splitlines()[-1].startswith("parascale: finished at ")
    assert (out / "checkpoints" / "log.txt").read_text() == whole
    assert json.loads((out / "record.json").read_text())["status"] == "ok"


def test_log_txt_of_a_run_without_checkpoints(tmp_path):
    out = tmp_path / "plain"
    run_training(out, **{**RUN, "steps": 3})
    log = (out / "log.txt").read_text()
    assert "epoch 1/1" in log and log.rstrip().splitlines()[-1].startswith("parascale: finished")
    assert not (out / "checkpoints").exists()
