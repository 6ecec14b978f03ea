"""parascale for a training script of one's own: ``parascale run script.py`` and the API the
script calls (docs/scripts.md)::

    import parascale.script as ps
    run = ps.start()                                  # join the world (or be a world of one)
    loader = run.shard(loader)                        # this rank's part of every global batch
    model, optimizer = run.setup(model, optimizer)    # wrapped for --sync
    for x, y in loader:                               # each batch begins a measured step
        optimizer.zero_grad()
        run.backward(loss_fn(model(x), y))            # loss.backward(), the loss kept
        optimizer.step()                              # exchange, then the optimizer's step
    run.log(accuracy=evaluate(model))                 # the epoch's evaluation, with direction

Outside ``parascale run`` the same script runs as a plain single process and writes nothing.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parascale.script.api import Run

__all__ = ["Run", "start", "current"]


def __getattr__(name: str):
    """``Run``, from its module on first use: it imports torch, and ``parascale run``'s
    options and checks (``parascale.script.options``, ``.launch``) are read without it."""
    if name == "Run":
        from parascale.script.api import Run

        return Run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_current: Run | None = None


def current() -> Run | None:
    """The run this process started, if it did."""
    return _current


def start() -> Run:
    """This copy's run: the world of ``parascale run`` (or torchrun's, srun's) joined, or, in a
    plain process, a world of one on this machine's loopback. Called again, the same run."""
    global _current
    if _current is not None:
        return _current
    import torch.distributed as dist

    from parascale import sync
    from parascale.config import TrainConfig
    from parascale.runtime import World, contract, external_launcher, join
    from parascale.runtime import resolve_backend, resolve_device_type
    from parascale.script.api import Run

    spec = json.loads(os.environ.get(contract.SCRIPT) or "null")
    cfg = TrainConfig.from_dict(spec["config"]) if spec else TrainConfig()
    sync.settle(cfg)  # a plain process names no strategy: the default's, with its options
    name = Path(spec["path"] if spec else sys.argv[0] or "script").name
    args = spec["argv"] if spec else sys.argv[1:]
    device_type = resolve_device_type(cfg.processes.device, cfg.processes.gpus)
    backend = resolve_backend(cfg.processes.backend, device_type)
    if dist.is_initialized():  # the script joined a world itself: take it as it is
        import torch

        local = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend() == "nccl" else torch.device("cpu")
        world = World(dist.get_rank(), dist.get_world_size(), local, device, dist.get_backend(),
                      external_launcher() or "local")
    elif spec is None and external_launcher() is None:
        world = _alone(backend, cfg.processes.timeout)
    else:
        world = join(device_type, backend, cfg.processes.gpus, cfg.processes.timeout)
    _current = Run(cfg, world, name, list(args))
    return _current


def _alone(backend: str, timeout_s: float):
    """A world of one, so that the script's collectives (and ours) run unchanged: its store on
    loopback, at a port the kernel chooses."""
    import torch
    import torch.distributed as dist

    from parascale.runtime import World, open_store

    store = open_store(None)
    dist.init_process_group(backend, store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return World(0, 1, 0, torch.device("cpu"), backend, "plain")
