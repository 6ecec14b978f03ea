"""When a checkpoint is due, and writing it: the loop asks after every step and every epoch.

``--checkpoint-every N`` is due after every step whose number N divides; ``Ne`` after every
epoch whose number N divides. A step checkpoint that falls on an epoch's last step is written
after the epoch's entry (and evaluation) instead, so that a resume starts the next epoch with
the finished one recorded. Writing is collective (every rank's state is gathered; under a sharded
strategy every rank also writes its part of the model and optimizer, sharded.py);
rank 0 writes the files, removes the ones beyond ``--keep``, and says one line; every rank
waits for that.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from parascale.config import TrainConfig
from parascale.record import VERSION, now
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint import state

if TYPE_CHECKING:
    from parascale.batch import Plan
    from parascale.runtime import World
    from parascale.training.checkpoint.trained import Trained


class CheckpointWriter:
    """Writes the run's checkpoints when they are due (``--checkpoint-every``, ``--keep``)."""

    def __init__(self, interval: tuple[int, str], folder: Path, keep: int,
                 cfg: TrainConfig, world: World, plan: Plan):
        self.every, self.unit = interval
        self.folder, self.keep, self.cfg, self.world, self.plan = folder, keep, cfg, world, plan
        self.written, self.write_s = 0, 0.0
        self.last: str | None = None  # the newest checkpoint written, and its size
        self.bytes: int | None = None

    def due_after_step(self, step: int) -> bool:
        """Within an epoch (the loop does not ask after its last step)."""
        return self.unit == "steps" and step % self.every == 0

    def due_after_epoch(self, epoch: int, step: int) -> bool:
        if self.unit == "epochs":
            return epoch % self.every == 0
        return step % self.every == 0

    def write(self, run: Trained, position: dict[str, int],
              epoch_part: dict[str, Any] | None = None,
              generator: torch.Generator | None = None) -> float:
        """Collective: checkpoint the run at ``position``; the seconds it took (every rank)."""
        started = time.perf_counter()
        saved = state.capture(run, position, epoch_part, generator)
        derived = self.plan.derived
        manifest = {"epoch": position["epoch"], "step_in_epoch": position["done"],
                    "total_steps": self.plan.total_steps, "world_size": self.world.size,
                    "global_batch": derived.global_batch, "effective_lr": derived.effective_lr,
                    "sync": self.cfg.strategy.sync, "written": now(), "parascale": VERSION,
                    "torch": torch.__version__, "config": self.cfg.to_dict()}
        found: checkpoint.Found | None = None
        if run.strategy.shards_checkpoint:  # every rank writes its part
            from parascale.training.checkpoint import sharded

            found = sharded.write(run, self.folder, position["step"], saved, manifest)
        elif saved is not None:  # rank 0
            found = checkpoint.save(self.folder, position["step"], saved, manifest)
        if found is not None:  # rank 0
            checkpoint.prune(self.folder, self.keep, position["step"])
            self.last, self.bytes = found.label, found.manifest["bytes"]
            where = (f"epoch {position['epoch']} after its step {position['done']}"
                     if position["done"] else f"end of epoch {position['epoch'] - 1}")
            print(f"parascale: checkpoint {found.label} (step {position['step']}, {where}; "
                  f"{self.bytes / 1e6:.1f} MB in {time.perf_counter() - started:.2f} s)",
                  flush=True)
        if self.world.size > 1:
            # No rank starts the next step before the files are whole: a rank that dies in that
            # step (and so kills rank 0 mid-write) would otherwise cost this checkpoint.
            dist.barrier()
        spent = time.perf_counter() - started
        self.written += 1
        self.write_s += spent
        return spent

    def summary(self) -> dict[str, Any]:
        """The record's ``checkpoints`` section (docs/record.md), this attempt's writes."""
        return {"every": self.cfg.checkpoint.checkpoint_every, "unit": self.unit,
                "keep": self.keep, "folder": str(self.folder), "written": self.written,
                "write_s": self.write_s, "last": self.last, "last_bytes": self.bytes}
