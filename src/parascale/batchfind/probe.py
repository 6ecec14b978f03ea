"""One probe of the batch search, in a process of its own: ``python -m parascale.batchfind.probe``.

Reads its task from ``PARASCALE_PROBE`` (JSON: model, classes, input shape, batch, device,
budget, the file to answer in), runs two training steps (forward, backward, an SGD step with
momentum: the second step holds the optimizer's state too) on random inputs of the data set's
shape, and writes whether they fitted and the peak memory. Memory does not depend on the
values, and the process is gone afterwards, so the next probe starts clean.
"""
from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch
from torch import nn

from parascale import models
from parascale.files import atomic_write_text

ENV = "PARASCALE_PROBE"


def run(task: dict) -> dict:
    device = torch.device(task["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shape, batch = tuple(task["input_shape"]), task["batch"]
    try:
        torch.manual_seed(0)
        model = models.build(task["model"], task["num_classes"], shape).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(batch, *shape, device=device)
        y = torch.randint(0, task["num_classes"], (batch,), device=device)
        for _ in range(2):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
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


def _peak(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


if __name__ == "__main__":
    task = json.loads(os.environ[ENV])
    atomic_write_text(Path(task["answer"]), json.dumps(run(task)))
