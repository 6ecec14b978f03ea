"""The batch search on this machine, printing each probe: what ``parascale find-batch`` and
``bench --batch-size max`` both run."""
from __future__ import annotations

import tempfile

SHARE_OF_FREE = 0.5  # the CPU budget without --memory-limit: of the memory available now


def largest(cfg, gpu: int | None, budget: int | None, max_batch: int, why: str = "",
            share: int = 1, workers: int | None = None):
    """Search ``cfg``'s model and data (already checked) on GPU ``gpu`` or on the CPU within
    ``budget``, printing each probe; (the search, the device, the limit). ``share``: the
    workers the training set is split between (each one's batch must fit its share).
    ``workers``: each probe trains on that many workers with ``cfg.strategy.sync`` (and
    ``cfg.processes.gpus``), so the batch is the one that fits that strategy's memory layout
    (:mod:`.sharded`)."""
    from parascale import batchfind, sync
    from parascale.batchfind.sharded import probe_by_training

    device = "cpu" if gpu is None else f"cuda:{gpu}"
    where = f"GPU {gpu}" if gpu is not None else f"CPU, budget {gib(budget)}{why}"
    if workers is not None:
        where = (f"GPUs {','.join(map(str, cfg.processes.gpus))}" if cfg.processes.gpus else
                 f"CPU, {workers} workers, budget {gib(budget)} each{why}")
        changed = sync.get(cfg.strategy.sync).settings_of(cfg).changed()  # the options given
        where += f", --sync {' '.join([cfg.strategy.sync, *changed])}"
        share = workers
    task, what, samples = _task(cfg) if cfg.job.task is not None else _builtin(cfg)
    print(f"parascale find-batch: {what}, {where}", flush=True)
    limit = max(1, min(max_batch, samples // share))
    task.update(device=device, budget=budget)
    with tempfile.TemporaryDirectory(prefix="parascale-probe-") as folder:
        try_batch = probe_by_training(cfg, workers, budget) if workers is not None else \
            batchfind.probe_in_child(task, folder)
        found = batchfind.search(try_batch, budget, limit=limit, report=show)
    return found, device, limit


def _builtin(cfg) -> tuple[dict, str, int]:
    """A registry model on random inputs of its data set's shape."""
    from parascale import data, models

    facts = data.prepare(cfg)
    shape = "x".join(map(str, facts["input_shape"]))
    return ({"model": cfg.job.model, "num_classes": facts["num_classes"],
             "input_shape": list(facts["input_shape"]), "sizes": models.options(cfg)},
            f"{cfg.job.model} on {cfg.data.dataset} ({shape})", facts["train"])


def _task(cfg) -> tuple[dict, str, int]:
    """A ``--task``, loaded and tried once here (what is wrong with it is one line before any
    probe), then built by every probe from its own data."""
    from parascale import tasks

    facts = tasks.preflight(cfg)
    job = cfg.job
    return {"task": job.task, "seed": job.seed}, f"{job.task} on its own data", facts["train"]


def show(probe) -> None:
    if not probe.ran:
        print(f"  batch {probe.batch:>6}: {probe.reason}", flush=True)
        return
    peak = f", peak {gib(probe.peak_bytes)}" if probe.peak_bytes else ""
    over = " (over the budget)" if "over the budget" in probe.reason else \
        f" ({probe.reason})" if probe.reason else ""
    print(f"  batch {probe.batch:>6}: {'fits' if probe.fits else 'does not fit'}{peak}{over}",
          flush=True)


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.2f} GiB"
