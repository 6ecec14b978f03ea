"""What a rank's memory holds, by category: its parameters, gradients and optimizer state (the
local shards under a sharded strategy) and the activations forward keeps for backward.

Counted from the tensors themselves, once per attempt on its first step, so the same figures
come on the CPU (where the process's peak resident set is the only peak there is) and on GPUs;
the peak's rest (the interpreter and libraries, buffers, temporaries, DDP's gradient buckets,
a sharded unit gathered whole) is the record's ``rest_bytes``. Schema: docs/record.md.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (FSDP's parameters, gradients and state), else ``t``."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages under ``tensors`` (shared ones counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        try:
            storage = _local(t).untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            continue
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's optimizer state: ZeroRedundancyOptimizer keeps its part in ``.optim``."""
    inner = getattr(optimizer, "optim", optimizer)
    return tensor_bytes(v for state in inner.state.values() for v in state.values())


_NOTHING = contextlib.nullcontext()


class MemorySplit:
    """Measures once: activations during the first micro-batch's forward, the rest after the
    first optimizer step (gradients still there, optimizer state created)."""

    def __init__(self, enabled: bool = True):
        # under --compile the first step traces; saved-tensor hooks are left out of it
        self.enabled = enabled
        self.activations: int | None = None
        self.held: dict[str, int] | None = None

    def forward(self) -> contextlib.AbstractContextManager:
        """Context for a micro-batch's forward and backward: counts the first one's
        activations, and is a shared no-op after it (it is on every step's path)."""
        if not self.enabled or self.activations is not None:
            return _NOTHING
        return self._count()

    @contextlib.contextmanager
    def _count(self) -> Iterator[None]:
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            # weights saved for backward (or a view of them, as linear's transposed weight)
            # are parameters, counted as such
            if not (isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)):
                try:
                    storage = _local(t).untyped_storage()
                    saved[storage.data_ptr()] = storage.nbytes()
                except (RuntimeError, NotImplementedError):
                    pass
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.activations = sum(saved.values())

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if not self.enabled or self.held is not None:
            return
        params = list(model.parameters())
        self.held = {"parameter_count": sum(p.numel() for p in params),  # whole, not shards
                     "parameters_bytes": tensor_bytes(params),
                     "gradients_bytes": tensor_bytes(p.grad for p in params),
                     "optimizer_state_bytes": optimizer_state_bytes(optimizer)}

    def section(self, peak: int | None) -> dict[str, int | None] | None:
        """This rank's entry of the record's ``memory.split_per_rank``."""
        if self.held is None:
            return None
        split: dict[str, int | None] = {**self.held, "activations_bytes": self.activations}
        counted = sum(v for k, v in split.items() if v is not None and k.endswith("_bytes"))
        split["rest_bytes"] = None if peak is None else peak - counted
        return split
