"""One probe of the batch search, in a process of its own: ``python -m parascale.batchfind.probe``.

Reads its task from ``PARASCALE_PROBE`` (JSON: model, classes, input shape, batch, device,
budget, the file to answer in), runs two training steps (forward, backward, an SGD step with
momentum: the second step holds the optimizer's state too) on random inputs of the data set's
shape, or, with ``task`` (a ``--task package.module:function``), on the first items of the
task's own training data with its model, loss, collate and optimizer; and writes whether they
fitted and the peak memory. Memory does not depend on the values, and the process is gone
afterwards, so the next probe starts clean.
"""
from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch
from torch import nn

from parascale import models, safejson
from parascale.files import atomic_write_text
from parascale.runtime import contract

ENV = contract.PROBE


def run(task: dict) -> dict:
    device = torch.device(task["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        step = _task_step(task, device) if task.get("task") else _model_step(task, device)
        for _ in range(2):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except torch.OutOfMemoryError as exc:
        return {"fits": False, "reason": f"out of memory: {str(exc).splitlines()[0]}",
                "peak_bytes": _peak(device)}
    peak = _peak(device)
    budget = task.get("budget")
    if budget is not None and peak > budget:
        return {"fits": False, "peak_bytes": peak,
                "reason": f"peak {peak:,} bytes is over the budget of {budget:,}"}
    return {"fits": True, "peak_bytes": peak, "reason": ""}


def _model_step(task: dict, device: torch.device):
    """A built-in model on random inputs of the data set's shape, SGD with momentum."""
    shape, batch = tuple(task["input_shape"]), task["batch"]
    torch.manual_seed(0)
    model = models.build(task["model"], task["num_classes"], shape,
                         **task.get("sizes", {})).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    classes = task["num_classes"]
    if len(shape) == 1:  # token sequences (T,): ids in, a target for every position
        x = torch.randint(0, classes, (batch, *shape), device=device)
        y = torch.randint(0, classes, (batch, *shape), device=device)
    else:
        x = torch.randn(batch, *shape, device=device)
        y = torch.randint(0, classes, (batch,), device=device)

    def step() -> None:
        nn.functional.cross_entropy(model(x).flatten(0, -2), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _task_step(task: dict, device: torch.device):
    """A ``--task``'s own model, loss and optimizer (else SGD with momentum) on the first
    ``batch`` items of its training data, collated as the trainer does: its items' shapes are
    the task's, not a registry's."""
    from parascale.tasks import load
    from parascale.tasks.data import DatasetSplit

    job = load.load(task["task"], task.get("seed", 0))
    model = job.model().to(device)
    opt = job.optimizer(model.parameters(), 0.01) if job.optimizer is not None else \
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    split = DatasetSplit(job.train_data, job.collate)
    indices = torch.arange(task["batch"]) % len(split)
    batch = next(iter(split.batches([indices], device, train=True)))

    def step() -> None:
        job.loss(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _peak(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


if __name__ == "__main__":
    task = json.loads(os.environ[ENV])
    atomic_write_text(Path(task["answer"]), safejson.dumps(run(task)))
