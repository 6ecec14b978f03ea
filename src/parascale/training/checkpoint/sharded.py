"""Checkpoints of sharded state: every rank writes its own part through
``torch.distributed.checkpoint`` (DCP), and any number of workers reads it back.

Under ``--sync zero`` a rank holds the optimizer state of its parameters only, under ``--sync
fsdp`` its shards of the parameters, gradients and optimizer state. Gathering them on rank 0,
as the replicated checkpoints do (training/checkpoint/state.py), would need the whole state in one
process, which is what sharding avoids. Here the model and the optimizer's state go through
``get_state_dict`` (FSDP2's DTensors, and ZeRO's local optimizer, keyed by parameter name with
``flatten_optimizer_state_dict``) into ``dcp.save``; on resume, ``dcp.load`` fills each rank's
own parts as the new world lays them out, whatever the world that wrote them.

Only tensors go into DCP's files: DCP pickles anything else and reads it back with
``weights_only=False``, and the optimizer's other entries (learning rate, momentum...) are the
configuration's, which a resume must give again anyway. DCP's ``.metadata`` is a pickle too;
it is read by dcp_metadata.py, which builds nothing but DCP's own metadata classes.

The folder is written under a temporary name (checkpoint.temporary), each rank hashes the
files it wrote, and rank 0 writes the rest of the run's state beside them, hashes what is left
and commits the folder by renaming it (checkpoint.commit).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)

from parascale.files import full_disk, no_space
from parascale.training.checkpoint import disk as checkpoint
from parascale.training.checkpoint.dcp_metadata import Reader

if TYPE_CHECKING:
    from parascale.training.checkpoint.trained import Trained

#: optimizer state keyed "state.<parameter>.<name>": a rank's part is the keys of its
#: parameters, whatever partition wrote them
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(run: Trained) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's model and optimizer state dicts (flat, parameter names as keys)."""
    return get_state_dict(run.net, run.strategy.optimizer_part(run.optimizer), options=_OPTIONS)


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


class _Writer(FileSystemWriter):
    """DCP's writer, with a full disk raised as the OSError it is. ``torch.save`` raises one as
    its own RuntimeError ("enforce fail at inline_container.cc"), the OSError only its context,
    and DCP hands every rank's failure to the others pickled, which drops the context: the
    disk's answer would be lost before :func:`write` could name it."""

    def write_data(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().write_data(*args, **kwargs)
        except Exception as exc:
            full = full_disk(exc)
            if full is None:
                raise
            raise OSError(full.errno, full.strerror, full.filename) from exc


def write(run: Trained, folder: Path, step: int, saved: dict[str, Any] | None,
          manifest: dict[str, Any]) -> checkpoint.Found | None:
    """Collective: checkpoint ``step`` of the run into ``folder``, every rank its part of the
    model and optimizer, rank 0 ``saved`` (the rest of the state, ``state.capture``) and the
    manifest. The checkpoint on rank 0, None elsewhere."""
    world, tmp = run.world, checkpoint.temporary(folder, step)
    if world.is_main:  # a killed write's leftovers go before anyone writes
        checkpoint.remove(tmp)
        tmp.mkdir(parents=True)
    if world.size > 1:
        dist.barrier()
    model, optimizer = _state(run)
    try:
        # replicated tensors (ZeRO's parameters, buffers) are written once, by the lowest rank
        # holding them: rank 0's copy, as the replicated checkpoints keep
        dcp.save({"model": _tensors(model), "optimizer": _tensors(optimizer)},
                 storage_writer=_Writer(tmp, sync_files=True),
                 planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True))
    except CheckpointException as exc:  # every rank's: a full disk anywhere is the one line
        # each failure is (exception, traceback)
        full = next((f[0] for f in exc.failures.values() if full_disk(f[0])), None)
        if full is None:
            raise
        if world.is_main:
            checkpoint.remove(tmp)
        raise no_space(folder / checkpoint.name(step), full, checkpoint.KEPT) from exc
    # each rank hashes the files it wrote (DCP names them after the rank), in parallel
    mine = {n: checkpoint.file_facts(tmp / n) for n in sorted(os.listdir(tmp))
            if n.startswith(f"__{world.rank}_")}
    if not world.is_main:
        dist.gather_object(mine, dst=0)
        return None
    hashed: list[Any] = [None] * world.size
    if world.size > 1:
        dist.gather_object(mine, hashed, dst=0)
    else:
        hashed = [mine]
    if saved is None:
        return None
    files = {name: facts for part in hashed for name, facts in part.items()}
    return checkpoint.commit(folder, step, saved, manifest, files)


def load(run: Trained, folder: Path) -> None:
    """Collective: this rank's parts of the model and optimizer from the checkpoint in
    ``folder``, as this world shards them (DCP reads the parts each rank needs)."""
    model, optimizer = _state(run)  # the layout to fill, the optimizer's state made first
    parts = {"model": _tensors(model), "optimizer": _tensors(optimizer)}
    dcp.load(parts, storage_reader=Reader(folder))
    model.update(parts["model"])
    optimizer.update(parts["optimizer"])
    set_state_dict(run.net, run.strategy.optimizer_part(run.optimizer), model_state_dict=model,
                   optim_state_dict=optimizer, options=_OPTIONS)
