"""A diverging loss is caught at its step, named by step and rank in one line, decided the same
on every rank when the check is collective, with advice that fits the settings."""

import json
import os
import sys

import pytest

from helpers import train_captured
from parascale.config import TrainConfig


@pytest.mark.slow
@pytest.mark.parametrize("sync, where", [
    ("allreduce", "at step 3 on rank 1 (of 2); epoch 1, learning rate 0.05, no warm-up"),
    ("none", "at step 3 on rank 1 (decided by that rank alone"),
])
def test_divergence_is_named_by_step_and_rank_in_one_line(tmp_path, capfd, sync, where):
    proc, record = train_captured(tmp_path, capfd, "--workers", "2", "--epochs", "1", "--sync",
                                  sync, fault="nan@1:3")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("parascale: failed: rank 1 failed: training loss is nan " + where), \
        last
    assert record["status"] == "failed" and record["reason"] in last
    assert "NonFiniteLoss" in record["detail"] and "Traceback" in record["detail"]


WATCH_WORKER = """\
import json, os, pathlib, torch
from parascale.runtime import joined
from parascale.runtime.failure import serve_as_worker
from parascale.training.observe.divergence import DivergenceWatch, NonFiniteLoss


def body():
    out = pathlib.Path(os.environ["WATCH_OUT"])
    with joined("cpu", "gloo", None, 30.0, teardown=False) as world:
        watch = DivergenceWatch(world, os.environ["WATCH_COLLECTIVE"] == "1",
                                lambda step, rate: f"advice for rate {rate}")
        for step in range(1, 6):
            bad = world.rank == 1 and step == 3
            watch.observe(step, torch.tensor(float("nan") if bad else 1.0), 0.1 * step)
            try:
                watch.settle()
            except NonFiniteLoss as exc:
                report = {"at": step, "secondary": exc.secondary, "message": str(exc)}
                (out / f"rank{world.rank}.json").write_text(json.dumps(report))
                raise
        (out / f"rank{world.rank}.json").write_text(json.dumps({"at": None}))


serve_as_worker(body)
"""


@pytest.mark.slow
@pytest.mark.parametrize("collective", [True, False])
def test_divergence_decision_is_the_same_on_every_rank_only_when_collective(tmp_path,
                                                                           collective):
    from parascale.runtime import launch

    (tmp_path / "watch_worker.py").write_text(WATCH_WORKER)
    paths = os.pathsep.join([str(tmp_path)] + sys.path)
    outcome = launch("watch_worker", 2, {"PYTHONPATH": paths, "WATCH_OUT": str(tmp_path),
                                         "WATCH_COLLECTIVE": "1" if collective else "0"})
    assert outcome.status == "failed" and outcome.rank == 1, outcome
    assert "Traceback" in outcome.detail and "NonFiniteLoss" in outcome.detail
    one = json.loads((tmp_path / "rank1.json").read_text())
    assert not one["secondary"] and one["at"] in (3, 4)  # decided after the step, or the next
    assert one["message"].startswith("training loss is nan at step 3 on rank 1")
    assert one["message"].endswith("advice for rate 0.30000000000000004")  # step 3's rate
    zero = tmp_path / "rank0.json"
    if collective:  # rank 0 stopped at the same point, leaving the blame to rank 1
        assert json.loads(zero.read_text()) == {**one, "secondary": True}
    else:  # rank 0 never learnt of it: no per-step collective
        assert not zero.exists() or json.loads(zero.read_text())["at"] is None


def _advice(step: int = 3, rate: float = 0.8, **options) -> str:
    from parascale.batch import derive
    from parascale.training.observe.divergence import advice

    cfg = TrainConfig.of(**options)
    derived = derive(cfg, 8)
    warmup = round(cfg.optim.warmup_epochs * 10)
    return advice(cfg, derived, steps_per_epoch=10, warmup_steps=warmup, step=step, rate=rate)


def test_divergence_advice_fits_the_settings():
    scaled = _advice(lr=0.1, lr_scaling="linear", batch_size=32, precision="fp16")
    assert "linear scaling of --lr 0.1 from batch 32 to 256 gives 0.8" in scaled
    assert "no warm-up" in scaled and "momentum 0.9 (steps up to 10x the rate)" in scaled
    for lever in ("--warmup-epochs", "--lr-scaling sqrt", "--precision bf16", "lower --lr",
                  "lower --momentum (now 0.9)"):
        assert lever in scaled, (lever, scaled)

    warming = _advice(step=13, rate=0.3, lr=0.1, lr_scaling="sqrt", batch_size=32,
                      warmup_epochs=2, momentum=0.0)
    assert "epoch 2 (its step 3)" in warming and "in warm-up (step 13 of 20)" in warming
    assert "a longer --warmup-epochs" in warming
    for absent in ("momentum", "--lr-scaling sqrt", "precision"):
        assert absent not in warming, (absent, warming)

    plain = _advice(rate=0.05)
    assert plain.endswith("try a lower --lr (now 0.05), or a lower --momentum (now 0.9)")
    assert "\n" not in scaled + warming + plain
