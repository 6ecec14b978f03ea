"""Which checkpoint a run continues from, and whether it may: decided before training.

A local launch decides in the launching process, before any worker starts (so that a checkpoint
written with other settings is one line, exit code 2), and tells the workers through
``PARASCALE_RESUME``; after a restart it decides again. Under torchrun or srun every process is a
worker: rank 0 decides once the world has joined and tells the others (:func:`in_world`). Either
way, the newest checkpoint that verifies is taken; newer damaged ones are named, one line each.

A run continues from a checkpoint when ``--resume`` asks, after a restart by parascale's launcher,
or when torchrun restarted the workers (``TORCHELASTIC_RESTART_COUNT`` > 0) and the run writes
checkpoints. Without a usable checkpoint it starts from the beginning, and says so.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parascale import safejson, sync
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.files import check_writable_folder
from parascale.record import now
from parascale.runtime import env
from parascale.training.checkpoint import disk as checkpoint

if TYPE_CHECKING:
    from parascale.runtime.world import World

#: settings a resumed run may change: where and how it runs, how long, what it measures. Every
#: other one shapes the trajectory and must be the checkpoint's. The world size is compared
#: apart (``workers`` is resolved, and ``gpus`` may name other devices of the same count), and
#: so are the batch settings when it changes (:data:`PER_WORLD`).
MAY_DIFFER = frozenset({
    "out", "port", "timeout", "max_restarts", "checkpoint_every", "keep", "resume", "save_model",
    "oversubscribe", "verify_data", "download", "data_dir", "loader_workers", "threads",
    "epochs", "steps", "eval_every", "eval_batches", "target_accuracy", "target_metric", "target_value",
    "stop_at_target", "workers", "gpus",
    "profile", "noise_scale", "peak_tflops",  # they measure, and change nothing saved
})
#: what a run on another number of workers gives otherwise to train with the same global batch
#: and learning rate (they are compared instead, as the batch arithmetic derives them)
PER_WORLD = frozenset({"batch_size", "global_batch", "base_batch"})


@dataclass
class Choice:
    """The checkpoint a run continues from, and how it came to: ``by`` is resume (the user's
    --resume), restart (parascale's launcher) or torchrun (its agent restarted the workers)."""

    path: str
    by: str
    step: int
    epoch: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    rank: int | None = None  # a restart's failed rank and why
    reason: str | None = None
    at: str = field(default_factory=now)

    @property
    def label(self) -> str:
        return checkpoint.Found(Path(self.path), self.step).label

    def entry(self) -> dict[str, Any]:
        """The record's ``resumed`` item (docs/record.md)."""
        return {"at": self.at, "by": self.by, "checkpoint": self.label, "step": self.step,
                "epoch": self.epoch, "skipped": self.skipped, "rank": self.rank,
                "reason": self.reason}

    def to_env(self) -> str:
        return safejson.dumps(self.__dict__)

    @classmethod
    def from_env(cls) -> Choice | None:
        text = os.environ.get(env.RESUME_ENV)
        return cls(**json.loads(text)) if text else None


def checkpoints_of(cfg: TrainConfig) -> Path | None:
    """The run's DIR/checkpoints: the launcher's word in a local worker (whose --out is a
    staging folder), else --out's."""
    given = os.environ.get(env.CHECKPOINTS_ENV) if os.environ.get(env.LOCAL_ENV) else None
    if given:
        return Path(given)
    return checkpoint.folder_of(cfg.output.out) if cfg.output.out else None


def checkpointing(cfg: TrainConfig) -> bool:
    """Whether the run reads or writes checkpoints at all."""
    return cfg.checkpoint.checkpoint_every is not None or cfg.checkpoint.resume


def refuse_fresh_start(cfg: TrainConfig) -> None:
    """A run that starts afresh in a folder holding an earlier run's checkpoints is refused,
    one line, whether it writes checkpoints or not. One that writes them would mix its own with
    the earlier run's (a restart would take the newest, maybe the earlier run's). One that does
    not would set its results beside checkpoints that are not its own, which a later --resume
    would continue, replacing them; and an interrupted run's checkpoints are all it has, so a
    fresh run there has most likely forgotten --resume."""
    out = cfg.output.out
    if not out or cfg.checkpoint.resume or env.restarted_by_torchrun():  # no --out: none kept
        return
    folder = checkpoint.folder_of(out)
    present = checkpoint.listing(folder)
    if present:
        raise UsageError(f"--out {out} holds checkpoints of an earlier run (the newest at "
                         f"step {present[-1].step}); continue it with --resume, or remove "
                         f"{folder} to start afresh")


def check_folder(cfg: TrainConfig) -> None:
    """A run that keeps checkpoints (and its log beside them) needs DIR/checkpoints to be a
    folder it can write, holding nothing in the way of its files: checked before any worker
    starts, one line, rather than an OSError in rank 0 at its first checkpoint."""
    out = cfg.output.out
    if not out or not checkpointing(cfg):
        return
    folder = checkpoint.folder_of(out)
    if os.path.lexists(folder) and not folder.is_dir():
        raise UsageError(f"--out {out}: {folder} is not a folder, and the run's checkpoints "
                         "live in a folder of that name; move it away or choose another --out")
    check_writable_folder(folder, "the checkpoints folder")
    for path in checkpoint.in_the_way(folder):
        what = "not a folder" if path.suffix == "" and path.name.startswith("step-") else \
            "a folder" if path.is_dir() else "not a regular file"
        raise UsageError(f"--out {out}: {path} is {what}, where the run writes its "
                         f"{'log' if path.name == checkpoint.LOG_NAME else 'checkpoints'}; "
                         "remove it or choose another --out")


def mismatch(manifest: dict[str, Any], cfg: TrainConfig, size: int, total_steps: int | None,
             cut_short: int | None = None) -> str | None:
    """Why this run cannot continue from a checkpoint with ``manifest``, or None.
    ``cut_short``: the epoch the checkpoint's run ended in the middle of (``Found.cut_short``)."""
    resized = manifest["world_size"] != size
    if resized and (why := _fixed_size(manifest, cfg, size)):
        return why
    theirs, mine = _named(manifest.get("config") or {}), sync.settled(cfg).to_dict()
    may_differ = MAY_DIFFER | PER_WORLD if resized else MAY_DIFFER
    differ = [name for name in mine if name not in may_differ and name in theirs
              and json.dumps(theirs[name], sort_keys=True) != json.dumps(mine[name],
                                                                         sort_keys=True)]
    if differ:
        name = differ[0]
        more = f" (and {len(differ) - 1} more setting(s))" if len(differ) > 1 else ""
        return (f"it was written with --{name.replace('_', '-')} {_shown(theirs[name])} and "
                f"this run gives {_shown(mine[name])}{more}")
    if total_steps is None:  # not known yet (SMA tunes its learners first)
        return None
    if manifest["step"] > total_steps:
        return (f"it is at step {manifest['step']}, past the {total_steps} steps this run "
                "trains; give at least as many --epochs or --steps")
    if cut_short is not None and total_steps > manifest["step"]:
        # the loop would go on from the next epoch: the rest of this one never trained
        return (f"its run ended after step {manifest['step']}, in the middle of epoch "
                f"{cut_short}, and a longer run would leave the rest of that epoch untrained")
    return None


def _named(config: dict[str, Any]) -> dict[str, Any]:
    """A configuration as a run records it: the strategy and its own options named (what
    another parascale wrote, or a configuration never validated, may leave them out or hold
    other strategies' options at their defaults); as it is if it cannot be read."""
    try:
        return sync.settled(TrainConfig.from_dict(config)).to_dict()
    except (UsageError, TypeError, ValueError):
        return config


def _fixed_size(manifest: dict[str, Any], cfg: TrainConfig, size: int) -> str | None:
    """Why a checkpoint of ``manifest`` cannot continue on ``size`` workers, its world size
    being another, or None. Only one of a strategy that says it can (``resumes_resized``: each
    rank's part is read back as the new world lays the state out, or the state is whole once),
    and only with the global batch and learning rate it was written with (which older
    checkpoints do not state): the data order is then the same, each step's samples split
    otherwise."""
    from parascale.batch import derive

    before: int = manifest["world_size"]
    kind = sync.strategy_of(cfg)
    if not kind.resumes_resized(cfg) or manifest.get("global_batch") is None:
        able = [name for name in sync.names()
                if sync.get(name).resumes_resized(sync.settled(TrainConfig.of(sync=name)))]
        return (f"it was written by {before} workers and this run has {size}; the data order, "
                "each rank's state and the strategy's depend on it (checkpoints of --sync "
                f"{', '.join(able)} resume on any number)")
    derived = derive(cfg, size, kind.replicas_per_device(cfg))
    if derived.global_batch != manifest["global_batch"]:
        return (f"it was written with a global batch of {manifest['global_batch']} and this "
                f"run's on {size} worker(s) is {derived.global_batch}; give --global-batch "
                f"{manifest['global_batch']}")
    lr = manifest.get("effective_lr")
    if lr is not None and not math.isclose(derived.effective_lr, lr, rel_tol=1e-9):
        # the scaling rule's base batch is the per-device batch unless given
        base = (manifest.get("config") or {}).get("base_batch") or \
            manifest["global_batch"] // (before * cfg.batch.accumulate)
        return (f"it was written with a learning rate of {lr:g} and this run's on {size} "
                f"worker(s) is {derived.effective_lr:g}; give --base-batch {base}")
    return None


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "(none)"
    return str(value)


def choose(cfg: TrainConfig, size: int, total_steps: int | None, by: str,
           say: Callable[[str], None] = print, **why: Any) -> Choice | None:
    """The newest usable checkpoint of the run (UsageError when it belongs to other settings),
    or None: the run starts from the beginning, which is said."""
    folder = checkpoints_of(cfg)
    found, damaged = checkpoint.newest(folder, say) if folder else (None, [])
    skipped = [{"checkpoint": f.label, "problem": f.problem or ""} for f in damaged]
    if found is None:
        what = "no usable checkpoint" if damaged else "no checkpoint"
        say(f"parascale: {what} in {folder}; starting from the beginning")
        return None
    problem = mismatch(found.manifest, cfg, size, total_steps, found.cut_short)
    if problem:
        raise UsageError(f"cannot continue from {found.label}: {problem}; resume with the "
                         "settings it was written with, or start afresh in another --out")
    manifest = found.manifest
    return Choice(str(found.path), by, found.step, int(manifest.get("epoch", 0)), skipped,
                  **why)


def first_choice(cfg: TrainConfig, size: int, total_steps: int,
                 say: Callable[[str], None] = print) -> Choice | None:
    """A local launch's: what ``--resume`` continues from (None without it)."""
    refuse_fresh_start(cfg)
    return choose(cfg, size, total_steps, "resume", say) if cfg.checkpoint.resume else None


def in_world(cfg: TrainConfig, world: World, total_steps: int | None) -> Choice | None:
    """A worker's checkpoint to continue from: the launcher's choice in a local launch; under
    torchrun or srun rank 0's, told to every rank (a UsageError on every rank when refused).
    ``total_steps``: None while the strategy has a setting to decide first (see ``mismatch``)."""
    if world.launcher == "local":
        return Choice.from_env()
    by = "resume" if cfg.checkpoint.resume else "torchrun" if env.restarted_by_torchrun() else None
    if by is None or (by == "torchrun" and not checkpointing(cfg)):
        return None
    import torch.distributed as dist

    answer: list[Any] = [None, None]
    if world.is_main:
        try:
            chosen = choose(cfg, world.size, total_steps, by)
            answer = [None if chosen is None else chosen.__dict__, None]
        except UsageError as exc:
            answer = [None, str(exc)]
    dist.broadcast_object_list(answer, src=0)
    if answer[1]:
        raise UsageError(answer[1])
    return None if answer[0] is None else Choice(**answer[0])
