"""--val-fraction: a validation split held out of the training set, drawn by the seed."""
from __future__ import annotations

import pytest
import torch

from parascale import data
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.validation import validate

CPU = torch.device("cpu")


def split_of(cfg):
    bundle = data.build(cfg)
    return bundle, bundle.train.indices, bundle.val.indices


def test_the_held_out_samples_are_never_in_the_training_split():
    cfg = TrainConfig.of(dataset="digits", val_fraction=0.2, seed=4)
    bundle, train, val = split_of(cfg)
    assert (len(train), len(val)) == (1437 - 287, 287)
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert sorted(train.tolist() + val.tolist()) == list(range(1437))
    # a training batch of held-in positions maps to held-in samples of the full split
    full = data.build(TrainConfig.of(dataset="digits", seed=4))
    x, _ = next(bundle.train.batches([[0, 5]], CPU, train=False))
    expected, _ = next(full.train.batches([train[[0, 5]].tolist()], CPU, train=False))
    assert torch.equal(x, expected)


def test_the_seed_draws_the_split_and_the_same_seed_the_same_one():
    _, _, a = split_of(TrainConfig.of(dataset="digits", val_fraction=0.2, seed=1))
    _, _, b = split_of(TrainConfig.of(dataset="digits", val_fraction=0.2, seed=1))
    _, _, c = split_of(TrainConfig.of(dataset="digits", val_fraction=0.2, seed=2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_launcher_plans_with_the_held_in_count():
    facts = data.prepare(TrainConfig.of(dataset="digits", val_fraction=0.25))
    assert (facts["train"], facts["val"]) == (1437 - 359, 359)
    assert data.prepare(TrainConfig.of(dataset="digits"))["val"] == 0
    assert data.build(TrainConfig.of(dataset="digits")).val is None


@pytest.mark.parametrize("value", [-0.1, 1.0, 2.0])
def test_a_fraction_outside_0_to_1_is_one_line(value):
    with pytest.raises(UsageError, match=r"--val-fraction is a fraction in \[0, 1\)"):
        validate(TrainConfig.of(val_fraction=value))
