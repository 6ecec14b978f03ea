"""A run's state between two steps, gathered from every rank into one checkpoint, and restored.

What a checkpoint holds (a dict saved by :mod:`.disk`):

- ``position``: the optimizer steps done, and where the sampler stands: the epoch it is in and
  the steps of it done (0 at an epoch's start). The data order is a pure function of (seed,
  epoch) and the learning rate of the step, so nothing else about them needs keeping.
- ``shared``: the model and optimizer (and gradient scaler) when every rank holds the same
  (``Strategy.replicas_agree``); otherwise each rank's own are in ``ranks``. Under a strategy
  whose ranks hold parts of them (``Strategy.shards_checkpoint``, ``sharded`` True), the model
  and optimizer are in the files every rank writes beside it (training/checkpoint/sharded.py), and
  ``shared`` holds the gradient scaler alone.
- ``ranks``: per rank, the strategy's state (``Strategy.state_dict``), every RNG state (torch's
  global CPU and CUDA generators, numpy's, Python's, and the epoch's augmentation generator,
  seeded per rank), and what the epoch in progress has measured (loss sum, time, step rows).
- ``progress``: what the record needs from before (``Progress.state_dict``,
  training/record/progress.py): finished epochs, time-to-accuracy, training time so far, earlier
  resumes, SMA's tuned learner count. Each rank's step rows of finished epochs are in ``ranks``.

Gathering is collective (``gather_object`` to rank 0, which alone writes); it happens after the
divergence check has decided every step so far, so a checkpoint never holds a diverged model.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from parascale.sync.base import unwrap

if TYPE_CHECKING:
    from parascale.training.checkpoint.trained import Trained


def _tensors(value: Any, change) -> Any:
    """``value`` with ``change`` applied to every tensor in it (dicts, lists and tuples)."""
    if isinstance(value, torch.Tensor):
        return change(value)
    if isinstance(value, dict):
        return {k: _tensors(v, change) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v, change) for v in value)
    return value


def _cpu(value: Any) -> Any:
    """A copy of ``value`` with every tensor on the CPU (gather_object pickles what it gets)."""
    return _tensors(value, lambda t: t.detach().to("cpu", copy=True))


def _owned(value: Any) -> Any:
    """A copy of loaded state that owns its memory (the file is memory-mapped)."""
    return _tensors(value, torch.clone)


def rng_states(device: torch.device, generator: torch.Generator | None) -> dict[str, Any]:
    numpy_state: Any = np.random.get_state()  # the legacy tuple: (name, keys, pos, ...)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)),
                  *map(float, numpy_state[2:])],
        "python": random.getstate(),
        "epoch": generator.get_state() if generator is not None else None,
    }


def set_rng_states(states: dict[str, Any], device: torch.device) -> None:
    """Every global generator as it was (the epoch's is set where the epoch builds it)."""
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and states["cuda"] is not None:
        torch.cuda.set_rng_state(states["cuda"], device)
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss),
                         float(cached)))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


def _rows(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, 5)


def capture(run: Trained, position: dict[str, int], epoch_part: dict[str, Any] | None,
            generator: torch.Generator | None) -> dict[str, Any] | None:
    """Collective: every rank's state, gathered; the checkpoint on rank 0, None elsewhere.

    ``epoch_part``: this rank's measurements of the epoch in progress (None at an epoch's end).
    """
    run.divergence.settle(final=True)  # every step so far decided finite
    agree, sharded = run.strategy.replicas_agree, run.strategy.shards_checkpoint
    mine: dict[str, Any] = {
        "strategy": _cpu(run.strategy.state_dict()),  # collective for some strategies
        "rng": rng_states(run.world.device, generator),
        "epoch_part": _cpu(epoch_part),
        "rows": {epoch: _rows(rows) for epoch, rows in run.progress.rows.items()},
    }
    if not agree and not sharded:
        mine.update(_trained(run))
    if not run.world.is_main:
        dist.gather_object(mine, dst=0)
        return None
    gathered: list[Any] = [None] * run.world.size
    if run.world.size > 1:
        dist.gather_object(mine, gathered, dst=0)
    else:
        gathered = [mine]
    shared = {"scaler": _scaler(run)} if sharded else _trained(run) if agree else None
    return {"position": dict(position), "replicas_agree": agree, "sharded": sharded,
            "shared": shared, "ranks": gathered,
            "progress": run.progress.state_dict()}


def _model_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state_dict without tensors on the meta device: structure, no data (SMA's
    stacked learners keep their model's layout that way)."""
    return {k: v for k, v in module.state_dict().items() if not v.is_meta}


def _load_model(module: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    structure = {k: v for k, v in module.state_dict().items() if v.is_meta and k not in saved}
    module.load_state_dict({**saved, **structure})


def _trained(run: Trained) -> dict[str, Any]:
    return {"model": _cpu(_model_state(unwrap(run.net))),
            "optimizer": _cpu(run.optimizer.state_dict()),
            "scaler": _scaler(run)}


def _scaler(run: Trained) -> dict[str, Any] | None:
    return None if run.scaler is None else run.scaler.state_dict()


def restore(run: Trained, saved: dict[str, Any], where: Path) -> dict[str, Any]:
    """Put this rank's model, optimizer, scaler, strategy state and RNGs back (collective, for
    the strategies that talk to their servers and for sharded ones); return this rank's part of
    the checkpoint. ``where``: the checkpoint (a sharded one's folder holds the model)."""
    mine = _mine(saved["ranks"], run.world.rank, run.world.size)
    if saved.get("sharded"):
        from parascale.training.checkpoint import sharded

        sharded.load(run, where)
        trained = _owned(saved["shared"])
    else:
        trained = _owned(saved["shared"]) if saved["replicas_agree"] else mine
        _load_model(unwrap(run.net), trained["model"])
        run.optimizer.load_state_dict(trained["optimizer"])
    if run.scaler is not None and trained["scaler"] is not None:
        run.scaler.load_state_dict(trained["scaler"])
    run.strategy.load_state_dict(mine["strategy"])
    set_rng_states(mine["rng"], run.world.device)
    run.progress.rows = {int(epoch): rows.tolist() for epoch, rows in mine["rows"].items()}
    return mine


def _mine(ranks: list[dict[str, Any]], rank: int, size: int) -> dict[str, Any]:
    """This rank's part of a checkpoint written by ``len(ranks)`` ranks. On another number of
    workers (``Strategy.resumes_resized``: resume.mismatch lets no other change it) rank r
    takes the RNGs, timings and strategy state of rank r mod N_before, and the epoch in
    progress is shared out again: its loss sum evenly (the epoch's loss is their sum over the ranks), and
    its gradient noise measurements dropped (each rank's batch, which they are of, changed)."""
    mine = _owned(ranks[rank % len(ranks)])
    part = mine["epoch_part"]
    if len(ranks) != size and part is not None:
        total = sum(float(r["epoch_part"]["loss_sum"]) for r in ranks)
        mine["epoch_part"] = {**part, "loss_sum": torch.tensor(total / size, dtype=torch.float64),
                              "noise": None}
    return mine
