"""Memory by category (training/observe/memory_split.py): counted from the tensors on each rank."""
import pytest
import torch
from conftest import STEPS
from torch import nn

from parascale.training.observe.memory_split import MemorySplit, optimizer_state_bytes, tensor_bytes


def test_shared_storages_are_counted_once():
    a = torch.zeros(10)
    assert tensor_bytes([a, a[:5], None, torch.zeros(3, dtype=torch.float64)]) == 40 + 24


def test_a_step_splits_into_parameters_gradients_state_and_activations():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    split = MemorySplit()
    with split.forward():
        loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    optimizer.step()
    split.after_step(model, optimizer)
    params = (8 * 16 + 16 + 16 * 2 + 2) * 4
    got = split.section(peak=10**6)
    assert got["parameters_bytes"] == got["gradients_bytes"] == params
    assert got["optimizer_state_bytes"] == params  # one momentum buffer per parameter
    # the input (4 x 8 floats) and the ReLU's output (4 x 16), which the second layer saves
    # too; not the weights, which linear saves transposed (a view of the parameter)
    assert got["activations_bytes"] == (4 * 8 + 4 * 16) * 4
    assert got["parameter_count"] == params // 4
    assert got["rest_bytes"] == 10**6 - sum(v for k, v in got.items()
                                            if k.endswith("_bytes") and k != "rest_bytes")


def test_only_the_first_step_is_measured():
    model = nn.Linear(2, 2)
    split = MemorySplit()
    with split.forward():
        model(torch.randn(1, 2)).sum().backward()
    first = split.activations
    with split.forward():
        model(torch.randn(100, 2)).sum().backward()
    assert split.activations == first
    assert optimizer_state_bytes(torch.optim.SGD(model.parameters(), lr=1)) == 0


@pytest.mark.slow
def test_sharded_strategies_hold_their_part_on_each_rank(train_run):
    def split(**options):
        record, _ = train_run(workers=2, global_batch=32, **options, **STEPS)
        return record["memory"]["split_per_rank"]

    whole, zero, fsdp = split(), split(sync="zero"), split(sync="fsdp")
    for rank in (0, 1):
        assert zero[rank]["parameters_bytes"] == whole[rank]["parameters_bytes"]
        # ZeRO splits the state by parameter, FSDP each parameter: neither holds it all
        assert zero[rank]["optimizer_state_bytes"] < whole[rank]["optimizer_state_bytes"]
        for kind in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes"):
            assert fsdp[rank][kind] <= whole[rank][kind] // 2 + 64 * 4, kind
    assert sum(z["optimizer_state_bytes"] for z in zero) == whole[0]["optimizer_state_bytes"]
    assert fsdp[0]["parameter_count"] == whole[0]["parameter_count"]  # the whole model's
