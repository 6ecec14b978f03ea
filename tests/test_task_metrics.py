"""How a task's metrics are computed and judged: batch means weighted by their samples, the model
run once per batch for the loss and every metric, and a target reached in its metric's
direction."""
import pytest
import torch
from torch import nn

from parascale.config import EvaluationConfig, OptimConfig
from parascale.runrecord import EpochEntry
from parascale.tasks import Metric, Task, build_optimizer, samples_in
from parascale.tasks.builtin import accuracy, cross_entropy
from parascale.tasks.data import DatasetSplit
from parascale.training.loop.evaluate import evaluate_alone
from parascale.training.record.target import time_to_target


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.calls = nn.Linear(4, 3), 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


def test_the_model_runs_once_per_batch_for_the_loss_and_every_metric():
    items = [(torch.randn(4), torch.tensor(i % 3)) for i in range(10)]
    task = Task(train_data=items, eval_data=items, model=Counting, loss=cross_entropy,
                metrics=[Metric("accuracy", accuracy, True)])
    model = Counting()
    values = evaluate_alone(task, model, DatasetSplit(items), batch=4)
    assert model.calls == 3  # batches of 4, 4 and 2
    x = torch.stack([x for x, _ in items])
    y = torch.stack([y for _, y in items])
    with torch.no_grad():
        logits = model.linear(x)
    assert abs(values["loss"] - torch.nn.functional.cross_entropy(logits, y).item()) < 1e-6
    assert abs(values["accuracy"] - (logits.argmax(1) == y).double().mean().item()) < 1e-12


def test_uneven_batches_give_the_mean_over_every_sample():
    items = [{"v": torch.tensor([float(i)])} for i in range(7)]
    task = Task(train_data=items, eval_data=items, model=lambda: nn.Linear(1, 1),
                loss=lambda net, b: b["v"].mean(),
                metrics=[Metric("square", lambda net, b: (b["v"] ** 2).mean(), False)])
    values = evaluate_alone(task, nn.Linear(1, 1), DatasetSplit(items), batch=3)
    # float32 batch means, summed in float64: exact to float32's precision
    assert values == pytest.approx({"loss": 3.0, "square": sum(i * i for i in range(7)) / 7},
                                   rel=1e-6)


def test_a_batch_counts_the_samples_of_its_first_tensor():
    assert samples_in({"x": torch.zeros(5, 2), "y": torch.zeros(5)}) == 5
    assert samples_in((torch.zeros(3, 1), torch.zeros(3))) == 3
    assert samples_in([{"ids": torch.zeros(2, 8)}]) == 2


@pytest.mark.parametrize("choice", [dict(optimizer="adamw", weight_decay=0.1, adam_beta2=0.99),
                                    dict(optimizer="sgd", momentum=0.9, weight_decay=1e-4)])
def test_the_built_in_optimizers_keep_torchs_default_numbers_on_the_cpu(choice):
    """The fused kernel is CUDA's alone: on the CPU it rounds otherwise (the control below), and
    runs there would no longer give the numbers they gave."""
    task = Task(train_data=[], eval_data=[], model=lambda: None, loss=lambda n, b: 0)
    optim = OptimConfig(lr=0.01, **choice)

    def trained(fused: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 3))
        optimizer = build_optimizer(task, optim, model.parameters())
        for group in optimizer.param_groups:
            assert not group["fused"]
            group["fused"] = fused
        generator = torch.Generator().manual_seed(1)
        for _ in range(10):
            model(torch.randn(4, 8, generator=generator)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert not torch.equal(trained(False), trained(True))


def test_a_target_is_reached_in_its_metrics_direction():
    task = Task(train_data=[], eval_data=[], model=lambda: None, loss=lambda n, b: 0,
                metrics=[Metric("mae", lambda n, b: 0, False)])
    cfg = EvaluationConfig(target_metric="mae", target_value=0.3)
    directions = task.directions()
    above = time_to_target(cfg, directions, entry(1, test_mae=0.4), None)
    assert above["reached"] is False and above["metric"] == "mae"
    below = time_to_target(cfg, directions, entry(2, test_mae=0.3), above)
    assert below == {"target": 0.3, "metric": "mae", "higher_is_better": False,
                     "reached": True, "split": "test", "epoch": 2, "elapsed_s": 2.0}
    loss = EvaluationConfig(target_metric="loss", target_value=1.9, evaluate_test=False)
    assert time_to_target(loss, directions, entry(1, val_loss=1.8), None)["reached"]


def entry(epoch: int, **metrics: float) -> EpochEntry:
    """An evaluated epoch's entry, at ``epoch`` seconds."""
    return EpochEntry(epoch, False, 4, False, 1.0, [1.0], [1.0], 64, 64.0, 0.5, 0.1, None, None,
                      None, metrics=dict(metrics), elapsed_s=float(epoch))


def test_the_optimizer_is_the_tasks_own_or_the_chosen_one():
    params = list(nn.Linear(2, 1).parameters())
    own = Task(train_data=[], eval_data=[], model=lambda: None, loss=lambda n, b: 0,
               optimizer=lambda p, lr: torch.optim.RMSprop(p, lr=lr))
    assert isinstance(build_optimizer(own, OptimConfig(lr=0.3), params), torch.optim.RMSprop)
    plain = Task(train_data=[], eval_data=[], model=lambda: None, loss=lambda n, b: 0)
    adamw = build_optimizer(plain, OptimConfig(optimizer="adamw", weight_decay=0.01), params)
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["weight_decay"] == 0.01
    sgd = build_optimizer(plain, OptimConfig(momentum=0.8), params)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.8
