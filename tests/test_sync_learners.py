"""Learners on one device: both engines are M independent replicas, batch norm included."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from parascale import models
from parascale.sync.learners import ENGINES, make_learners

SHAPE = (1, 16, 16)
B = 4


def model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return models.build(name, 10, SHAPE)


def batch(m: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m * B, *SHAPE, generator=g), torch.randint(0, 10, (m * B,), generator=g)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["mlp", "lenet", "resnet20"])
@pytest.mark.parametrize("m", [1, 3])
def test_training_equals_m_independent_replicas(engine, name, m):
    """The engine's loss is the mean over all M x B rows, so each learner's gradient is 1/M of
    its own batch's: the replicas here are given that loss (their mean loss over M)."""
    base = model(name)
    learners = make_learners(base, m, engine)
    replicas = [copy.deepcopy(base) for _ in range(m)]
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
    opt = torch.optim.SGD(learners.parameters(), **sgd)
    opts = [torch.optim.SGD(r.parameters(), **sgd) for r in replicas]
    for step in range(3):
        x, y = batch(m, step)
        out = learners(x)
        theirs = [r(x[j * B:(j + 1) * B]) for j, r in enumerate(replicas)]  # one forward each
        torch.testing.assert_close(out, torch.cat(theirs), atol=1e-5, rtol=1e-4)
        nn.functional.cross_entropy(out, y).backward()
        opt.step()
        opt.zero_grad()
        for j, (logits, o) in enumerate(zip(theirs, opts)):
            (nn.functional.cross_entropy(logits, y[j * B:(j + 1) * B]) / m).backward()
            o.step()
            o.zero_grad()
    own = torch.stack([nn.utils.parameters_to_vector(r.parameters()) for r in replicas])
    torch.testing.assert_close(learners.vectors(), own.detach(), atol=1e-5, rtol=1e-4)
    for mine, theirs in zip(learners.buffer_tensors(), zip(*(r.buffers() for r in replicas))):
        torch.testing.assert_close(mine, torch.stack(theirs).to(mine.dtype))


@pytest.mark.parametrize("engine", ENGINES)
def test_each_learner_keeps_its_own_batch_norm_statistics(engine):
    learners = make_learners(model("resnet20"), 2, engine)
    x, y = batch(2)
    x[B:] += 3.0  # the second learner's rows have another mean
    nn.functional.cross_entropy(learners(x), y).backward()
    running = [t for t in learners.buffer_tensors() if t.is_floating_point()]
    assert running and not torch.allclose(running[0][0], running[0][1])


@pytest.mark.parametrize("engine", ENGINES)
def test_vectors_round_trip_and_set_the_learners(engine):
    learners = make_learners(model("lenet"), 2, engine)
    v = learners.vectors()
    assert v.shape == (2, sum(p.numel() for p in model("lenet").parameters()))
    x, _ = batch(2)
    before = learners(x).detach()
    learners.set_vectors(torch.stack([v[0], torch.zeros_like(v[1])]))
    after = learners(x).detach()
    torch.testing.assert_close(after[:B], before[:B])
    assert not torch.allclose(after[B:], before[B:])
    torch.testing.assert_close(learners.vectors()[1], torch.zeros_like(v[1]))


def test_a_batch_that_does_not_split_over_the_learners_is_refused():
    with pytest.raises(ValueError, match="does not split over 3 learners"):
        make_learners(model("mlp"), 3, "loop")(torch.zeros(4, *SHAPE))


def test_auto_runs_vmap_from_four_learners_where_it_was_measured_faster():
    from parascale.sync.learners import VMAP_FROM, engine_for

    assert [engine_for(m) for m in (1, 2, VMAP_FROM, 8)] == ["loop", "loop", "vmap", "vmap"]
    assert engine_for(8, "loop") == "loop" and engine_for(1, "vmap") == "vmap"
    with pytest.raises(ValueError, match="unknown learner engine 'gpu'"):
        engine_for(2, "gpu")
