"""Batch arithmetic has one home (parascale.batch): train and bench say the same about a batch."""
from __future__ import annotations

import pytest

import parascale
from parascale.batch import derive, indivisible, make_plan
from parascale.bench.plan import scaling_configs
from parascale.bench.study import combine, make_jobs
from parascale.config import TrainConfig
from parascale.errors import UsageError

TINY = {"model": "mlp", "dataset": "digits", "steps": 2}


@pytest.mark.parametrize("global_batch, workers, accumulate, words", [
    (100, 3, 1, "global batch 100 does not divide by 3 workers"),
    (30, 1, 4, "global batch 30 does not divide by 1 workers x 4 accumulation steps"),
    (64, 2, 4, None),
])
def test_one_sentence_says_whether_a_batch_divides(global_batch, workers, accumulate, words):
    assert indivisible(global_batch, workers, accumulate) == words


@pytest.mark.parametrize("global_batch, workers, accumulate", [(63, 2, 1), (30, 1, 4)])
def test_train_refuses_the_batch_that_bench_skips_with_the_same_words(global_batch, workers,
                                                                      accumulate):
    options = {**TINY, "global_batch": global_batch, "accumulate": accumulate}
    job = make_jobs(combine(options=options, scaling="strong", workers=str(workers)))[0]
    with pytest.raises(UsageError) as refused:
        parascale.train(TrainConfig.of(**options, workers=workers))
    sentence = indivisible(global_batch, workers, accumulate)
    assert job.skip_reason == sentence and job.per_device_batch is None
    assert str(refused.value).startswith(sentence + "; try ")


def test_the_planner_and_the_trainer_split_a_global_batch_alike():
    for n, per_device, global_batch, reason in scaling_configs("strong", [1, 2, 3, 4],
                                                               global_batch=96):
        assert reason is None
        derived = derive(TrainConfig.of(global_batch=global_batch), n)
        assert (derived.per_device_batch, derived.global_batch) == (per_device, global_batch)


def test_the_suggestion_is_a_batch_that_divides():
    with pytest.raises(UsageError, match=r"; try (\d+)$") as refused:
        derive(TrainConfig.of(global_batch=50, accumulate=2), 4)
    suggested = int(str(refused.value).rsplit(" ", 1)[1])
    assert indivisible(suggested, 4, 2) is None and suggested <= 50


def test_a_plan_counts_whole_global_batches_and_rounds_epochs_up():
    plan = make_plan(TrainConfig.of(batch_size=10, steps=7, warmup_epochs=0.5), 2, 105, 40,
                     replicas=1)
    # 105 samples hold 5 whole batches of 20; 7 steps take a second, partial epoch
    assert (plan.steps_per_epoch, plan.total_steps, plan.epochs, plan.warmup_steps) == (5, 7, 2, 2)
    assert plan.record_section()["global_batch"] == 20
    no_step_fits = make_plan(TrainConfig.of(batch_size=64), 2, 100, 10, replicas=1)
    assert no_step_fits.epochs == 0
