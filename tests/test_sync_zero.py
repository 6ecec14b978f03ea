"""ZeRO stage 1 (--sync zero): the foundation test, one worker, and what it refuses."""
import pytest
import torch
from conftest import STEPS, assert_same

from parascale.config import TrainConfig
from parascale.errors import UsageError


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_two_workers_with_half_the_batch_end_with_one_workers_parameters(train_run, accumulate):
    _, single = train_run(workers=1, global_batch=32, **STEPS)
    record, state = train_run(workers=2, global_batch=32, sync="zero", accumulate=accumulate,
                              **STEPS)
    assert record["config"]["sync"] == "zero"
    assert record["derived"]["sync_options"]["sharded"] is True
    assert_same(state, single)


@pytest.mark.slow
def test_adamw_on_two_workers_ends_with_one_workers_parameters(train_run):
    """Issue 32, item 1: ZeRO rebuilt the optimizer from its ``defaults``, which hold AdamW's
    ``decoupled_weight_decay``, a keyword its constructor does not take: every rank failed."""
    options = {**STEPS, "optimizer": "adamw", "lr": 0.01, "weight_decay": 0.01}
    _, single = train_run(workers=1, global_batch=32, **options)
    record, state = train_run(workers=2, global_batch=32, sync="zero", **options)
    assert record["status"] == "ok" and record["derived"]["sync_options"]["sharded"] is True
    assert_same(state, single)


@pytest.mark.slow
def test_one_worker_runs_unsharded_and_says_so(train_run, capfd):
    record, _ = train_run(workers=1, global_batch=32, sync="zero", **STEPS)
    assert record["derived"]["sync_options"]["sharded"] is False
    assert "nothing to shard" in capfd.readouterr().out


@pytest.mark.slow
def test_a_resumed_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path, monkeypatch):
    from conftest import run_training

    # 5 steps an epoch; checkpoints after steps 3 and 6, the fault stops the run before step 8
    options = dict(workers=2, global_batch=256, steps=8, lr=0.1, momentum=0.9,
                   weight_decay=1e-4, seed=3, timeout=30.0, sync="zero")
    _, expected = run_training(tmp_path / "whole", **options)
    out = tmp_path / "cut"
    monkeypatch.setenv("PARASCALE_FAULT", "raise@1:8")
    run_training(out, expect="failed", checkpoint_every=3, **options)
    monkeypatch.delenv("PARASCALE_FAULT")
    record, resumed = run_training(out, checkpoint_every=3, resume=True, **options)
    assert record["resumed"][0]["step"] == 6
    # the momentum of both ranks' parts came back: bit for bit the uninterrupted parameters
    assert resumed.keys() == expected.keys()
    assert all(torch.equal(resumed[k], expected[k]) for k in expected)


def test_allreduce_options_belong_to_allreduce():
    from parascale import sync

    with pytest.raises(UsageError, match="belongs to --sync allreduce"):
        sync.validate(TrainConfig.from_dict(dict(sync="zero", compression="fp16")))
