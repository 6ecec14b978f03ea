"""Gather what every rank measured and build the run record on rank 0 (schema: docs/record.md)."""
from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from parascale import data, flops
from parascale import record as rec
from parascale.batch import Plan
from parascale.config import TrainConfig
from parascale.files import atomic_write_bytes
from parascale.runtime import World
from parascale.runtime.memory_cap import own_peak
from parascale.sync.base import Strategy
from parascale.training.contention import machine_section
from parascale.training.measure import peak_memory, steady_figures, step_summary
from parascale.training.memory_split import MemorySplit
from parascale.training.run import Summary


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _affinity() -> list[int] | None:
    """The cores this process may run on (a search pins each trial to its own)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None


def assemble(cfg: TrainConfig, world: World, plan: Plan, strategy: Strategy,
             summary: Summary, memory: MemorySplit | None = None) -> dict | None:
    """Collective: every rank must call it. Rank 0 writes model.pt, then record.json.

    ``summary`` (training/run.py) is this rank's: its steady step rows, what was left out of
    them and which steps they are; its share of the contention measurement; the trial's number
    and the epoch it was pruned after, in a hyperparameter search; the record's ``resumed``,
    ``restarts``, ``checkpoints``, ``profile`` and ``noise`` sections; and the times
    (``total_s`` is the run's training time, earlier attempts' up to the checkpoint this one
    resumed included, ``training_s`` this attempt's). ``memory``: this rank's bytes by
    category (training/memory_split.py).
    """
    epochs, tta, times = summary.epochs, summary.tta, summary.times
    steady_rows, excluded = summary.steady.rows, summary.steady.excluded
    window, search, continuity = summary.window, summary.search, summary.continuity
    peak = peak_memory(world.device)
    mine = {"rows": steady_rows, "memory": peak, "cgroup_peak": own_peak(),
            "split": memory.section(peak[1]) if memory is not None else None,
            "device": _device_name(world.device), "host": socket.gethostname(),
            "window": window, "cpus": _affinity()}
    gathered: list[dict] = [None] * world.size  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    if not world.is_main:
        return None
    rows = [g["rows"] for g in gathered]
    last = epochs[-1]
    tested = [e for e in epochs if e.get("test_loss") is not None
              or e.get("val_loss") is not None]
    derived = {**plan.record_section(), "threads_per_worker": torch.get_num_threads(),
               "bytes_per_step": strategy.bytes_per_step, "sync_options": strategy.options()}
    record = {
        "schema": rec.SCHEMA, "status": "ok", "reason": None, "detail": None,
        "config": {**cfg.to_dict(), "workers": world.size},
        "derived": derived,
        "task": summary.task,
        "environment": rec.environment(world.backend, world.device.type,
                                       [g["device"] for g in gathered],
                                       [g["host"] for g in gathered], world.launcher,
                                       times.start) | {
            "cpu_affinity_per_rank": [g["cpus"] for g in gathered]},
        "epochs": epochs,
        "steps": step_summary(rows, excluded),
        "memory": {"kind": gathered[0]["memory"][0],
                   "peak_bytes_per_rank": [g["memory"][1] for g in gathered],
                   "reserved_bytes_per_rank": [g["memory"][2] for g in gathered],
                   "cgroup_peak_bytes_per_rank": [g["cgroup_peak"] for g in gathered],
                   "split_per_rank": [g["split"] for g in gathered]
                   if any(g["split"] for g in gathered) else None},
        "time_to_accuracy": tta,
        "sync": strategy.measurements(),
        "machine": machine_section([g["window"] for g in gathered]),
        # the local launcher adds the command's own times once the workers have ended
        "timing": {"training_s": times.training_s, "first_step_at": times.first_step_at}
        if world.launcher == "local" else None,
        **continuity,
        "summary": {
            "setup_time_s": times.setup_s, "total_time_s": times.total_s,
            **steady_figures(epochs, rows, summary.steady.source, plan.steps_per_epoch,
                             plan.derived.global_batch),
            "warmup_included": all(e["warmup"] for e in epochs),
            "final_test_accuracy": tested[-1]["test_accuracy"] if tested else None,
            "final_test_loss": tested[-1]["test_loss"] if tested else None,
            **({"final_val_accuracy": tested[-1].get("val_accuracy")}
               if tested and "val_accuracy" in tested[-1] else {}),
            "final_train_loss": last["train_loss"],
            # every metric of the last evaluation, by its epoch key (test_loss, val_mae...)
            "final_metrics": {k: v for k, v in tested[-1].items()
                              if k.startswith(("test_", "val_")) and v is not None}
            if tested else {},
        },
        "study": None,
        **({"search": search} if search is not None else {}),
    }
    _add_flops(record, cfg, world, plan)
    if (tokens := data.tokens_per_sample(cfg)) is not None:
        from parascale.data import text

        record["derived"]["tokens_per_sample"] = tokens
        record["summary"].update(text.figures(record["summary"], tokens))
    if cfg.out:
        if cfg.save_model:
            buffer = io.BytesIO()
            torch.save(strategy.model_state_dict(), buffer)
            atomic_write_bytes(Path(cfg.out, "model.pt"), buffer.getvalue())
        rec.write(cfg.out, record)
    return record


def _add_flops(record: dict, cfg: TrainConfig, world: World, plan) -> None:
    """Replace what the loop measured (``flops.measure``) with the record's ``flops`` section,
    and give the summary its FLOPs per step, achieved FLOP/s and utilisation."""
    measured = record.get("flops")
    if not measured:
        record["flops"] = None
        return
    summary = record["summary"]
    section = flops.section(measured["per_device"], measured["devices"], world.size,
                            cfg.accumulate, summary.get("steady_throughput"),
                            plan.derived.global_batch)
    if measured.get("error"):
        section["error"] = measured["error"]
    record["flops"] = section
    summary.update({key: section[key] for key in ("flops_per_step", "achieved_flops", "mfu")})
