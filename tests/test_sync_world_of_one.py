"""One worker pays no gradient exchange: allreduce trains the plain model (no DDP, no process
group needed), which is what makes the test below run in this process without one."""
import torch
from torch import nn

from parascale.config import TrainConfig
from parascale.runtime.world import World
from parascale.sync.allreduce import AllReduce

ALONE = World(rank=0, size=1, local_rank=0, device=torch.device("cpu"), backend="gloo",
              launcher="local")


def test_allreduce_alone_trains_the_model_itself_and_sends_nothing():
    model = nn.Linear(3, 2)
    strategy = AllReduce(TrainConfig(), ALONE)
    assert strategy.wrap(model) is model  # DDP here would need init_process_group
    assert strategy.bytes_per_step == 0
    with strategy.accumulating(last=False):
        model(torch.ones(1, 3)).sum().backward()
    with strategy.accumulating(last=True):
        model(torch.ones(1, 3)).sum().backward()
    assert strategy.compute_end() is None
    torch.testing.assert_close(model.bias.grad, torch.full((2,), 2.0))
    assert strategy.local_module() is model
    assert strategy.options() == {"bucket_mb": 25.0, "compression": "none"}
