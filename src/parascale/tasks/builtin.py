"""The built-in family: image classification from the model and dataset registries.

``--model resnet20 --dataset digits`` is this task: (images, classes) batches from
:mod:`parascale.data`, a model from :mod:`parascale.models`, cross-entropy, and accuracy,
higher is better, which judges the run. Its records read as they always did (``test_loss``,
``test_accuracy``...), since a metric's record key is ``<split>_<name>``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from parascale import data, models
from parascale.data.split import DataBundle
from parascale.tasks.base import Metric, Task


def cross_entropy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch  # a token model's (B, T, V) logits flattened against (B, T): per token
    return F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())


def accuracy(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return (model(x).argmax(dim=-1) == y).double().mean()


def classification(cfg, bundle: DataBundle | None = None) -> tuple[Task, DataBundle]:
    """The task of the model on the dataset, and its data (built unless given)."""
    bundle = bundle if bundle is not None else data.build(cfg)

    def model() -> nn.Module:
        return models.build(cfg.job.model, bundle.num_classes, bundle.input_shape,
                            **models.options(cfg))

    # a text dataset's samples are T tokens each (--model gpt --dataset shakespeare)
    tokens = data.tokens_per_sample(cfg)
    task = Task(train_data=bundle.train, eval_data=bundle.test, model=model, loss=cross_entropy,
                metrics=[Metric("accuracy", accuracy, True)],
                name=f"{cfg.job.model} on {cfg.data.dataset}",
                unit="tokens" if tokens else "samples", units_per_sample=float(tokens or 1))
    return task, bundle
