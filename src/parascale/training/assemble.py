"""Gather what every rank measured and build the run record on rank 0 (schema: docs/record.md)."""
from __future__ import annotations

import io
import socket
from statistics import median

import torch
import torch.distributed as dist

from parascale.config import TrainConfig
from parascale.files import atomic_write_bytes
from parascale.runtime import World
from parascale.training import record as rec
from parascale.training.measure import peak_memory, step_summary


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def assemble(cfg: TrainConfig, world: World, plan, strategy, epochs: list[dict],
             steady_rows: list[list[float]], excluded: str, tta: dict | None,
             times: dict) -> dict | None:
    """Collective: every rank must call it. Rank 0 writes model.pt, then record.json."""
    mine = {"rows": steady_rows, "memory": peak_memory(world.device),
            "device": _device_name(world.device), "host": socket.gethostname()}
    gathered: list[dict] = [None] * world.size  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    if not world.is_main:
        return None
    steady = [e for e in epochs if not e["warmup"]] or epochs
    last = epochs[-1]
    tested = [e for e in epochs if e["test_accuracy"] is not None]
    derived = {**plan.record_section(), "threads_per_worker": torch.get_num_threads(),
               "bytes_per_step": strategy.bytes_per_step, "sync_options": strategy.options()}
    record = {
        "schema": rec.SCHEMA, "status": "ok", "reason": None, "detail": None,
        "config": {**cfg.to_dict(), "workers": world.size},
        "derived": derived,
        "environment": rec.environment(world.backend, world.device.type,
                                       [g["device"] for g in gathered],
                                       [g["host"] for g in gathered], world.launcher,
                                       times["start"]),
        "epochs": epochs,
        "steps": step_summary([g["rows"] for g in gathered], excluded),
        "memory": {"kind": gathered[0]["memory"][0],
                   "peak_bytes_per_rank": [g["memory"][1] for g in gathered]},
        "time_to_accuracy": tta,
        "sync": strategy.measurements(),
        "summary": {
            "setup_time_s": times["setup_s"], "total_time_s": times["total_s"],
            "steady_epoch_time_s": median(e["wall_time_s"] for e in steady),
            "steady_throughput": median(e["throughput"] for e in steady),
            "warmup_included": len(epochs) == 1,
            "final_test_accuracy": tested[-1]["test_accuracy"] if tested else None,
            "final_test_loss": tested[-1]["test_loss"] if tested else None,
            "final_train_loss": last["train_loss"],
        },
        "study": None,
    }
    if cfg.out:
        if cfg.save_model:
            buffer = io.BytesIO()
            torch.save(strategy.local_module().state_dict(), buffer)
            atomic_write_bytes(f"{cfg.out}/model.pt", buffer.getvalue())
        rec.write(cfg.out, record)
    return record
