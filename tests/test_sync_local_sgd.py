"""Local SGD with H > 1 against a hand computation: N replicas trained in this process.

The reference builds the same model with the same seed, gives replica r exactly the batches
rank r gets (``train_shard``), steps each with its own SGD optimizer (own momentum buffer) and
replaces every replica's parameters by their mean after steps H, 2H, ...; the model evaluated
and saved at the end is the mean of the replicas (5 steps with H = 2: the last step was local).
"""
import pytest
import torch
from conftest import assert_same
from torch import nn

from parascale import data, models
from parascale.config import TrainConfig
from parascale.training.loop.sampling import train_shard

OPTIONS = dict(model="mlp", dataset="digits", steps=5, lr=0.1, momentum=0.9, weight_decay=1e-4,
               seed=5, sync="local-sgd", period=2)
WORKERS, PER_DEVICE = 2, 16


def reference(cfg: TrainConfig, workers: int, per_device: int) -> dict[str, torch.Tensor]:
    bundle = data.build(cfg)
    replicas = []
    for _ in range(workers):
        torch.manual_seed(cfg.job.seed)
        replicas.append(models.build(cfg.job.model, bundle.num_classes, bundle.input_shape))
    optimizers = [torch.optim.SGD(m.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum,
                                  weight_decay=cfg.optim.weight_decay) for m in replicas]
    batches = []
    for rank in range(workers):
        shard = train_shard(len(bundle.train), per_device, workers, rank, 1, cfg.job.seed, 1,
                            cfg.batch.steps)
        batches.append(list(bundle.train.batches([s[0] for s in shard], "cpu", train=True)))

    def average() -> None:
        with torch.no_grad():
            for params in zip(*(m.parameters() for m in replicas)):
                mean = torch.stack(params).mean(0)
                for p in params:
                    p.copy_(mean)

    for step in range(cfg.batch.steps):
        for model, optimizer, mine in zip(replicas, optimizers, batches):
            x, y = mine[step]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if (step + 1) % cfg.strategy.sync_options["period"] == 0:
            average()
    average()  # what is evaluated and saved
    return replicas[0].state_dict()


@pytest.mark.slow
def test_local_sgd_matches_the_hand_computed_reference(train_run):
    record, state = train_run(workers=WORKERS, batch_size=PER_DEVICE, **OPTIONS)
    expected = reference(TrainConfig.from_dict(OPTIONS), WORKERS, PER_DEVICE)
    assert_same(state, expected)
    assert record["sync"] == {"averages": 2}
    assert record["derived"]["sync_options"]["period"] == 2
    # one ring allreduce of the parameters every 2 steps: 2(n-1)/n * S / 2 bytes per step
    params = sum(t.numel() for t in expected.values()) * 4
    assert record["derived"]["bytes_per_step"] == params // 2


def test_without_averaging_the_reference_would_differ():
    # the control: the reference must be sensitive to the period, or the test above proves little
    expected = reference(TrainConfig.from_dict(OPTIONS), WORKERS, PER_DEVICE)
    other = reference(TrainConfig.from_dict({**OPTIONS, "period": 5}), WORKERS, PER_DEVICE)
    assert max(float((expected[k] - other[k]).abs().max()) for k in expected) > 1e-4
