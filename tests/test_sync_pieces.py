"""The arithmetic the strategies rely on, in one process: bytes sent, the parameter server's SGD
update, and the flat vector of parameters or gradients."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parascale.sync.compression import allreduced_bytes
from parascale.sync.flat import Flat, shard_bounds
from parascale.sync.ps_protocol import sgd_update


def linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(10, 4)  # weight 4 x 10 = 40 values, bias 4


def test_allreduced_bytes_without_compression_is_every_trainable_value_at_its_size():
    assert allreduced_bytes(linear(), "none", 1) == (40 + 4) * 4  # fp32
    frozen = linear()
    frozen.bias.requires_grad_(False)
    assert allreduced_bytes(frozen, "none", 1) == 40 * 4
    assert allreduced_bytes(linear().double(), "none", 1) == (40 + 4) * 8


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_allreduced_bytes_in_half_precision_is_two_bytes_a_value(compression):
    assert allreduced_bytes(linear(), compression, 1) == (40 + 4) * 2


def test_allreduced_bytes_under_powersgd_follows_the_hooks_compression_rule():
    # weight (4, 10) at rank 1: P and Q are (4 + 10)·1 = 14 values, and 14·2 < 40, so compressed;
    # bias (4,) as a (4, 1) matrix: (4 + 1)·1 = 5, 5·2 >= 4, so sent whole
    assert allreduced_bytes(linear(), "powersgd", 1) == (14 + 4) * 4
    # at rank 2, (4 + 10)·2 = 28 and 28·2 >= 40: not worth it, the weight goes whole too
    assert allreduced_bytes(linear(), "powersgd", 2) == (40 + 4) * 4
    # a conv weight (8, 3, 3, 3) is an 8 x 27 matrix: (8 + 27)·1 = 35, 70 < 216; bias 8 whole
    assert allreduced_bytes(nn.Conv2d(3, 8, 3), "powersgd", 1) == (35 + 8) * 4


OPTIMIZERS = [dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
              dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False),
              dict(momentum=0.9, dampening=0.1, weight_decay=1e-3, nesterov=False),
              dict(momentum=0.9, dampening=0.0, weight_decay=5e-4, nesterov=True)]


@pytest.mark.parametrize("settings", OPTIMIZERS)
def test_sgd_update_gives_torch_sgds_parameters_bit_for_bit(settings):
    # the same order of operations is what makes the parameter server agree with allreduce
    torch.manual_seed(1)
    ours = torch.randn(50)
    theirs = ours.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([theirs], lr=0.05, foreach=False, **settings)
    state: dict = {}
    for _ in range(4):
        grad = torch.randn(50)
        sgd_update(ours, grad, state, 0.05, **settings)
        theirs.grad = grad.clone()
        optimizer.step()
        assert torch.equal(ours, theirs.detach())


def test_sgd_update_by_hand():
    param, state = torch.tensor([1.0], dtype=torch.float64), {}
    grad = torch.tensor([0.5], dtype=torch.float64)
    settings = dict(momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False)
    sgd_update(param, grad, state, 0.1, **settings)  # buffer = 0.5; 1 - 0.1·0.5
    assert param.item() == pytest.approx(0.95)
    sgd_update(param, grad, state, 0.1, **settings)  # buffer = 0.9·0.5 + 0.5 = 0.95
    assert param.item() == pytest.approx(0.95 - 0.095)
    decayed = torch.tensor([1.0], dtype=torch.float64)
    sgd_update(decayed, grad, {}, 0.1, momentum=0.0, dampening=0.0, weight_decay=0.1,
               nesterov=False)  # gradient 0.5 + 0.1·1 = 0.6
    assert decayed.item() == pytest.approx(0.94)


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 2)  # 6 + 2 values
        self.frozen = nn.Linear(2, 2).requires_grad_(False)
        self.last = nn.Linear(2, 1)  # 2 + 1 values


def test_flat_holds_the_trainable_parameters_in_model_order():
    model = TwoLayers()
    flat = Flat(model)
    assert flat.numel == 11 and flat.bytes == 44 and flat.dtype == torch.float32
    vector = flat.gather_params(flat.new())
    expected = torch.cat([p.detach().reshape(-1) for p in
                          (model.first.weight, model.first.bias, model.last.weight, model.last.bias)])
    assert torch.equal(vector, expected)


def test_flat_scatters_parameters_back_and_leaves_frozen_ones_alone():
    model = TwoLayers()
    frozen = model.frozen.weight.detach().clone()
    flat = Flat(model)
    flat.scatter_params(torch.arange(11, dtype=torch.float32))
    assert model.first.weight.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert model.first.bias.tolist() == [6, 7]
    assert model.last.weight.tolist() == [[8, 9]] and model.last.bias.tolist() == [10]
    assert torch.equal(model.frozen.weight, frozen)


def test_flat_gradients_are_zero_where_a_parameter_got_none_and_copied_back_not_shared():
    model = TwoLayers()
    flat = Flat(model)
    model.first.weight.grad = torch.ones(2, 3)
    vector = flat.gather_grads(torch.full((11,), 7.0))
    assert vector.tolist() == [1.0] * 6 + [0.0] * 5  # the 7s where grads are missing are gone
    incoming = torch.arange(11, dtype=torch.float32)
    flat.scatter_grads(incoming)
    assert model.last.bias.grad.tolist() == [10]  # created where there was none
    assert model.first.weight.grad.tolist() == [[0, 1, 2], [3, 4, 5]]
    incoming.zero_()  # the next message reuses the buffer: gradients must not change with it
    assert model.last.bias.grad.tolist() == [10]
    assert model.first.weight.grad.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_flat_refuses_a_model_in_two_dtypes():
    model = TwoLayers()
    model.last.double()
    with pytest.raises(ValueError, match="one dtype"):
        Flat(model)


def test_shard_bounds_cover_the_vector_in_near_equal_pieces():
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(2, 3) == [(0, 0), (0, 1), (1, 2)]
