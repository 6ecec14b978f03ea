"""A regression task of one's own for parascale: dict batches, mean-squared error, and the mean
absolute error as the metric that judges the run (lower is better).

    parascale train --task regression:task --workers 2 --epochs 5 --optimizer adamw --lr 0.01

run in this folder (or with it on PYTHONPATH). The data is drawn from a fixed generator, so
every rank, and every run, has the same samples.
"""
import torch
from torch import nn
from torch.utils.data import Dataset

from parascale.tasks import Metric, Task

FEATURES = 8


class Points(Dataset):
    """y = x . w + 0.1 noise, for n points x ~ N(0, I); items are dicts of tensors."""

    def __init__(self, n: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        weights = torch.linspace(-1.0, 1.0, FEATURES, dtype=torch.float32)
        self.x = torch.randn(n, FEATURES, generator=generator)
        self.y = (self.x @ weights + 0.1 * torch.randn(n, generator=generator)).unsqueeze(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": self.y[i]}


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def mse(net: nn.Module, batch: dict) -> torch.Tensor:
    return nn.functional.mse_loss(net(batch["x"]), batch["y"])


def mae(net: nn.Module, batch: dict) -> torch.Tensor:
    return (net(batch["x"]) - batch["y"]).abs().mean()


def task() -> Task:
    return Task(train_data=Points(2048, seed=1), eval_data=Points(512, seed=2), model=model,
                loss=mse, metrics=[Metric("mae", mae, higher_is_better=False)], judge="mae",
                name="regression")
