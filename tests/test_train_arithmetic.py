"""Batch, learning-rate and sharding arithmetic: pure functions, checked against hand values."""
import math

import pytest
import torch

from parascale.batch import derive, resolve_lr
from parascale.config import OptimConfig, TrainConfig
from parascale.errors import UsageError
from parascale.training.loop.lr import lr_at
from parascale.training.loop.sampling import epoch_order, eval_shard, train_shard


@pytest.mark.parametrize("cfg, n, per_device, global_batch, lr", [
    (dict(batch_size=32), 4, 32, 128, 0.05),                                   # weak, no rule
    (dict(batch_size=32, lr_scaling="linear"), 4, 32, 128, 0.2),               # x4 from base 32
    (dict(global_batch=256, lr_scaling="linear", base_batch=64), 4, 64, 256, 0.2),
    (dict(global_batch=256, lr_scaling="sqrt", base_batch=64), 4, 64, 256, 0.1),
    (dict(batch_size=8, accumulate=4, lr_scaling="linear"), 2, 8, 64, 0.4),
    (dict(), 3, 32, 96, 0.05),                                                 # default batch
])
def test_effective_batch_and_learning_rate(cfg, n, per_device, global_batch, lr):
    d = derive(TrainConfig.of(**cfg), n)
    assert (d.per_device_batch, d.global_batch) == (per_device, global_batch)
    assert d.effective_lr == pytest.approx(lr)


def test_global_batch_that_does_not_divide_suggests_one_that_does():
    with pytest.raises(UsageError, match="does not divide by 3 workers; try 99"):
        derive(TrainConfig.of(global_batch=100), 3)


def test_scaling_rules():
    assert resolve_lr(0.1, "linear", 8192, 256) == pytest.approx(3.2)  # Goyal et al.
    assert resolve_lr(0.1, "sqrt", 1024, 256) == pytest.approx(0.2)
    assert resolve_lr(0.1, "none", 1024, 256) == 0.1


def test_gradual_warmup_rises_linearly_from_base_to_effective():
    rates = [lr_at(s, OptimConfig(lr=0.1), effective_lr=0.8, warmup_steps=10, total_steps=100)
             for s in range(12)]
    assert rates[0] == pytest.approx(0.1) and rates[10] == rates[11] == pytest.approx(0.8)
    steps = [b - a for a, b in zip(rates, rates[1:10])]
    assert all(s == pytest.approx(0.07) for s in steps)


def test_decay_schedules():
    common = dict(effective_lr=1.0, warmup_steps=0, total_steps=100)
    cosine = OptimConfig(lr=1.0, lr_schedule="cosine")
    assert lr_at(50, cosine, **common) == pytest.approx(0.5)
    assert lr_at(100, cosine, **common) == pytest.approx(0.0, abs=1e-12)
    step = OptimConfig(lr=1.0, lr_schedule="step", lr_milestones=(2, 4), lr_gamma=0.1)
    assert [lr_at(s, step, steps_per_epoch=10, **common) for s in (19, 20, 39, 40)] == \
        pytest.approx([1, 0.1, 0.1, 0.01])


def test_a_warmup_in_steps_rises_from_zero_and_the_cosine_ends_at_the_floor():
    # nanoGPT's get_lr with learning_rate 1e-3, warmup_iters 100, lr_decay_iters 2000, min_lr 1e-4
    optim = OptimConfig(lr=1e-3, warmup_steps=100, lr_schedule="cosine", lr_min=1e-4)
    recipe = dict(effective_lr=1e-3, warmup_steps=100, total_steps=2000)
    assert lr_at(0, optim, **recipe) == pytest.approx(1e-3 * 1 / 101)
    assert lr_at(99, optim, **recipe) == pytest.approx(1e-3 * 100 / 101)
    assert lr_at(100, optim, **recipe) == pytest.approx(1e-3)
    assert lr_at(1050, optim, **recipe) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert lr_at(2000, optim, **recipe) == pytest.approx(1e-4)


def test_warmup_steps_replace_warmup_epochs_and_the_floor_stays_below_the_rate():
    from parascale.batch import make_plan
    assert make_plan(TrainConfig.of(warmup_steps=7, batch_size=10), 1, 1000, 10,
                     replicas=1).warmup_steps == 7
    with pytest.raises(UsageError, match="--warmup-steps .* or --warmup-epochs, not both"):
        TrainConfig.of(warmup_steps=7, warmup_epochs=1).validate()
    with pytest.raises(UsageError, match="below --lr 0.05; got 0.1"):
        TrainConfig.of(lr_min=0.1).validate()


@pytest.mark.parametrize("world, per_device, accumulate", [(1, 32, 1), (2, 16, 1), (4, 8, 1),
                                                           (2, 8, 2), (4, 2, 4)])
def test_ranks_together_see_exactly_the_single_worker_batches(world, per_device, accumulate):
    n, seed, epoch = 203, 7, 2
    single = train_shard(n, 32, 1, 0, 1, seed, epoch)
    shards = [train_shard(n, per_device, world, r, accumulate, seed, epoch) for r in range(world)]
    assert all(len(s) == len(single) == n // 32 for s in shards)  # same step count everywhere
    for step, whole in enumerate(single):
        parts = torch.cat([mb for m in range(accumulate) for r in range(world)
                           for mb in [shards[r][step][m]]])
        assert torch.equal(parts, whole[0])


def test_every_epoch_is_reshuffled_identically_on_every_rank():
    assert torch.equal(epoch_order(100, 1, 1), epoch_order(100, 1, 1))
    assert not torch.equal(epoch_order(100, 1, 1), epoch_order(100, 1, 2))


@pytest.mark.parametrize("n, world", [(101, 2), (360, 7), (3, 4), (10, 3)])
def test_evaluation_shards_cover_each_sample_exactly_once(n, world):
    seen = torch.cat([i for r in range(world) for i in eval_shard(n, world, r, 16)] or
                     [torch.empty(0, dtype=torch.long)])
    assert sorted(seen.tolist()) == list(range(n))
    sizes = [sum(len(b) for b in eval_shard(n, world, r, 16)) for r in range(world)]
    assert max(sizes) - min(sizes) <= 1 and math.fsum(sizes) == n
