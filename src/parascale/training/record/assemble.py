"""Gather what every rank measured and build the run record on rank 0 (schema: docs/record.md),
for ``parascale train`` and ``parascale run`` alike."""
from __future__ import annotations

import io
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parascale import flops, runrecord, safejson, tasks
from parascale import record as rec
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.files import atomic_write_bytes
from parascale.runtime import World
from parascale.runtime.memory_cap import own_peak
from parascale.sync.base import Strategy
from parascale.training.observe.contention import machine_section
from parascale.training.observe.measure import peak_memory, steady_figures, step_summary
from parascale.training.observe.memory_split import MemorySplit
from parascale.training.record.summary import Summary


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _affinity() -> list[int] | None:
    """The cores this process may run on (a search pins each trial to its own)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None


def assemble(cfg: TrainConfig, world: World, plan: Plan, strategy: Strategy,
             summary: Summary, memory: MemorySplit | None = None,
             script: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Collective: every rank must call it. Rank 0 builds the record (:mod:`parascale.runrecord`),
    writes model.pt (with ``--save-model``) and record.json into ``--out``, and returns the
    record as written; None on other ranks.

    ``summary`` (training/record/summary.py) is this rank's: its epoch entries (every rank's figures
    already), its steady step rows, what was left out of them and which steps they are; its
    share of the contention measurement; the trial's number and the epoch it was pruned after,
    in a hyperparameter search; the record's ``resumed``, ``restarts``, ``checkpoints``,
    ``profile`` and ``noise`` sections; the FLOPs the loop counted; and the times
    (``total_s`` is the run's training time, earlier attempts' up to the checkpoint this one
    resumed included, ``training_s`` this attempt's). ``memory``: this rank's bytes by
    category (training/observe/memory_split.py). ``script``: ``parascale run``'s script section.
    """
    epochs, times = summary.epochs, summary.times
    peak = peak_memory(world.device)
    mine = {"rows": summary.steady.rows, "memory": peak, "cgroup_peak": own_peak(),
            "split": memory.section(peak[1]) if memory is not None else None,
            "device": _device_name(world.device), "host": socket.gethostname(),
            "window": summary.window, "cpus": _affinity()}
    gathered: list[dict] = [None] * world.size  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    if not world.is_main:
        return None
    rows = [g["rows"] for g in gathered]
    steady = steady_figures(epochs, rows, summary.steady.source, plan.steps_per_epoch,
                            plan.derived.global_batch)
    record = runrecord.finished(
        config={**tasks.recorded_config(cfg), "workers": world.size},
        derived={**plan.record_section(), "threads_per_worker": torch.get_num_threads(),
                 "bytes_per_step": strategy.bytes_per_step, "sync_options": strategy.options()},
        task=summary.task,
        environment=rec.environment(world.backend, world.device.type,
                                    [g["device"] for g in gathered],
                                    [g["host"] for g in gathered], world.launcher,
                                    times.start) | {
            "cpu_affinity_per_rank": [g["cpus"] for g in gathered]},
        epochs=epochs, steps=step_summary(rows, summary.steady.excluded),
        memory={"kind": gathered[0]["memory"][0],
                "peak_bytes_per_rank": [g["memory"][1] for g in gathered],
                "reserved_bytes_per_rank": [g["memory"][2] for g in gathered],
                "cgroup_peak_bytes_per_rank": [g["cgroup_peak"] for g in gathered],
                "split_per_rank": [g["split"] for g in gathered]
                if any(g["split"] for g in gathered) else None},
        time_to_accuracy=summary.tta, sync=strategy.measurements(),
        machine=machine_section([g["window"] for g in gathered]),
        # the local launcher adds the command's own times once the workers have ended
        timing={"training_s": times.training_s, "first_step_at": times.first_step_at}
        if world.launcher == "local" else None,
        continuity=summary.continuity,
        flops=_flops(summary.flops, cfg, world, plan, steady["steady_throughput"]),
        summary=runrecord.RunSummary(times.setup_s, times.total_s, steady),
        search=summary.search, script=script).to_dict()
    output = cfg.output
    if output.out:
        if output.save_model:
            buffer = io.BytesIO()
            torch.save(strategy.model_state_dict(), buffer)
            atomic_write_bytes(Path(output.out, rec.MODEL_NAME), buffer.getvalue())
        rec.write(output.out, record)
    return safejson.finite(record)


def _flops(measured: dict[str, Any] | None, cfg: TrainConfig, world: World, plan: Plan,
           steady_throughput: float | None) -> dict[str, Any] | None:
    """The record's ``flops`` section from what the loop counted (``flops.measure``): the
    FLOPs per step, achieved FLOP/s and utilisation; None when nothing was counted."""
    if not measured:
        return None
    section = flops.section(measured["per_device"], measured["devices"], world.size,
                            cfg.batch.accumulate, steady_throughput, plan.derived.global_batch)
    if measured.get("error"):
        section["error"] = measured["error"]
    return section
