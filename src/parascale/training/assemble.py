"""Gather what every rank measured and build the run record on rank 0 (schema: docs/record.md)."""
from __future__ import annotations

import io
import os
import socket

import torch
import torch.distributed as dist

from parascale import record as rec
from parascale.config import TrainConfig
from parascale.files import atomic_write_bytes
from parascale.runtime import World
from parascale.training.contention import machine_section
from parascale.training.measure import peak_memory, steady_figures, step_summary


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _affinity() -> list[int] | None:
    """The cores this process may run on (a search pins each trial to its own)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None


def assemble(cfg: TrainConfig, world: World, plan, strategy, epochs: list[dict],
             steady: tuple[list[list[float]], str, str], tta: dict | None, times: dict,
             window: dict, search: dict | None = None,
             continuity: dict | None = None) -> dict | None:
    """Collective: every rank must call it. Rank 0 writes model.pt, then record.json.

    ``steady`` is this rank's steady step rows, what was left out of them and which steps they
    are; ``window`` its share of the contention measurement (``CpuWatch.end_window``);
    ``search``: the trial's number and the epoch it was pruned after, in a hyperparameter search;
    ``continuity``: the record's ``resumed``, ``restarts``, ``checkpoints``, ``profile`` and
    ``noise`` sections.
    ``times``: ``total_s`` is the run's training time (earlier attempts' up to the checkpoint
    this one resumed included), ``training_s`` this attempt's.
    """
    steady_rows, excluded, steps_source = steady
    mine = {"rows": steady_rows, "memory": peak_memory(world.device),
            "device": _device_name(world.device), "host": socket.gethostname(),
            "window": window, "cpus": _affinity()}
    gathered: list[dict] = [None] * world.size  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    if not world.is_main:
        return None
    rows = [g["rows"] for g in gathered]
    last = epochs[-1]
    tested = [e for e in epochs if e["test_accuracy"] is not None
              or e.get("val_accuracy") is not None]
    derived = {**plan.record_section(), "threads_per_worker": torch.get_num_threads(),
               "bytes_per_step": strategy.bytes_per_step, "sync_options": strategy.options()}
    record = {
        "schema": rec.SCHEMA, "status": "ok", "reason": None, "detail": None,
        "config": {**cfg.to_dict(), "workers": world.size},
        "derived": derived,
        "environment": rec.environment(world.backend, world.device.type,
                                       [g["device"] for g in gathered],
                                       [g["host"] for g in gathered], world.launcher,
                                       times["start"]) | {
            "cpu_affinity_per_rank": [g["cpus"] for g in gathered]},
        "epochs": epochs,
        "steps": step_summary(rows, excluded),
        "memory": {"kind": gathered[0]["memory"][0],
                   "peak_bytes_per_rank": [g["memory"][1] for g in gathered],
                   "reserved_bytes_per_rank": [g["memory"][2] for g in gathered]},
        "time_to_accuracy": tta,
        "sync": strategy.measurements(),
        "machine": machine_section([g["window"] for g in gathered]),
        # the local launcher adds the command's own times once the workers have ended
        "timing": {"training_s": times.get("training_s", times["total_s"]),
                   "first_step_at": times["first_step_at"]}
        if world.launcher == "local" else None,
        **(continuity or {"resumed": None, "restarts": [], "checkpoints": None,
                          "profile": None, "noise": None}),
        "summary": {
            "setup_time_s": times["setup_s"], "total_time_s": times["total_s"],
            **steady_figures(epochs, rows, steps_source, plan.steps_per_epoch,
                             plan.derived.global_batch),
            "warmup_included": all(e["warmup"] for e in epochs),
            "final_test_accuracy": tested[-1]["test_accuracy"] if tested else None,
            "final_test_loss": tested[-1]["test_loss"] if tested else None,
            **({"final_val_accuracy": tested[-1].get("val_accuracy")}
               if tested and "val_accuracy" in tested[-1] else {}),
            "final_train_loss": last["train_loss"],
        },
        "study": None,
        **({"search": search} if search is not None else {}),
    }
    if cfg.out:
        if cfg.save_model:
            buffer = io.BytesIO()
            torch.save(strategy.local_module().state_dict(), buffer)
            atomic_write_bytes(f"{cfg.out}/model.pt", buffer.getvalue())
        rec.write(cfg.out, record)
    return record
