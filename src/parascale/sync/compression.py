"""Gradient compressors: what a strategy puts on the wire instead of its fp32 gradients.

A :class:`Compressor` turns a gradient into the tensor that is sent (``compress``) and a
received one back into a gradient (``decompress``), and counts the bytes that takes. One
instance per strategy, so state that a compressor keeps between steps (PowerSGD's error
feedback and warm-started Q) is its own. Three ways to use one:

- DDP (allreduce): :meth:`Compressor.ddp_hook`, a communication hook that compresses each
  bucket, all-reduces the compressed tensor and decompresses it (``none`` included, so the
  arithmetic is DDP's default hook's: divide, then sum);
- reduce-broadcast and the parameter server: ``compress`` before a send, ``decompress`` after a
  receive, on their flat gradient vectors; they need a compressor whose wire tensor is the
  gradient element by element (``elementwise``).
- PowerSGD is not elementwise: its two halves are separated by an all-reduce of P and one of Q
  (Vogels et al. 2019), so it exists only as a DDP hook (torch's); the other strategies refuse it.

``none`` sends fp32; ``fp16``/``bf16`` cast to half precision (half the bytes, ~3 significant
digits for fp16, ~2 for bf16 with fp32's range); ``powersgd`` sends a rank-r approximation P·Qᵀ
of each gradient matrix with error feedback, from the third step on (the first two are plain
allreduces, the minimum torch allows with error feedback and warm start).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.sync.options import Settings, option
from parascale.sync.traits import GRADIENT

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
else:  # the registry reads the options below without torch
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals(), "dist")
    nn = lazy.module("torch.nn", globals())
    powerSGD_hook = lazy.module("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook",
                                globals())

# torch's defaults, used for the byte count below as for the hook itself
POWERSGD_START_ITER = 2
POWERSGD_MIN_COMPRESSION_RATE = 2
NAMES = ("none", "fp16", "bf16", "powersgd")


class Compressor:
    """No compression: the gradient is sent as it is."""

    name = "none"
    #: the wire tensor is the gradient element by element (a cast), so it can be sliced
    elementwise = True

    def compress(self, grad: torch.Tensor) -> torch.Tensor:
        return grad

    def decompress(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if wire is not out:
            out.copy_(wire)
        return out

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def bytes_for(self, numel: int, element_size: int) -> int:
        return numel * element_size

    def sent_bytes(self, model: nn.Module) -> int:
        """Bytes of one copy of the model's gradients on the wire."""
        return sum(self.bytes_for(p.numel(), p.element_size())
                   for p in model.parameters() if p.requires_grad)

    def ddp_hook(self) -> tuple[Any, Callable]:
        """(state, hook) for ``DistributedDataParallel.register_comm_hook``."""
        return self, _compressed_allreduce


class Cast(Compressor):
    """Half precision on the wire, full precision in the model."""

    def __init__(self, name: str, dtype: torch.dtype):
        self.name, self.dtype = name, dtype

    def compress(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.to(self.dtype)

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.dtype

    def bytes_for(self, numel: int, element_size: int) -> int:
        return numel * self.dtype.itemsize


class PowerSGD(Compressor):
    """Rank-r approximation with error feedback; its state is torch's ``PowerSGDState``."""

    name = "powersgd"
    elementwise = False

    def __init__(self, rank: int):
        self.rank = rank

    def compress(self, grad: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("PowerSGD needs an all-reduce between its halves: DDP only")

    def ddp_hook(self) -> tuple[Any, Callable]:
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=self.rank,
            start_powerSGD_iter=POWERSGD_START_ITER,
            min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE)
        return state, powerSGD_hook.powerSGD_hook

    def sent_bytes(self, model: nn.Module) -> int:
        """The hook's own rule: each gradient viewed as an (n, m) matrix, r' = min(n, m, r), is
        sent as P (n x r') and Q (m x r') when (n + m)·r'·2 < n·m, otherwise whole (biases
        always)."""
        total = 0
        for p in model.parameters():
            if not p.requires_grad:
                continue
            n = p.shape[0] if p.dim() else 1
            m = p.numel() // max(n, 1)
            r = min(n, m, self.rank)
            compressed = (n + m) * r
            worth = compressed * POWERSGD_MIN_COMPRESSION_RATE < n * m
            total += (compressed if worth else n * m) * p.element_size()
        return total


_CLASSES: dict[str, type[Compressor]] = {"none": Compressor, "fp16": Cast, "bf16": Cast,
                                         "powersgd": PowerSGD}


def make(name: str, powersgd_rank: int = 1) -> Compressor:
    if name == "fp16":
        return Cast(name, torch.float16)
    if name == "bf16":
        return Cast(name, torch.bfloat16)
    if name == "powersgd":
        return PowerSGD(powersgd_rank)
    return Compressor()


@dataclass(frozen=True)
class CompressionSettings(Settings):
    """The options of every strategy that sends its gradients through a compressor."""

    compression: str = option(
        "none", "Gradient compression of the gradients a strategy sends: none | fp16 | bf16 | "
        "powersgd (PowerSGD needs DDP's all-reduce between its halves).", choices=NAMES,
        flag=True)
    powersgd_rank: int = option(
        1, "Rank r of PowerSGD's low-rank approximation (with --compression powersgd).",
        minimum=1, only_with=("compression", "powersgd"), flag=True)

    def compressor(self) -> Compressor:
        return make(self.compression, self.powersgd_rank)


def exact(settings: CompressionSettings) -> str | None:
    """``Strategy.equivalence`` of a strategy that sends the gradients through a compressor and
    steps on their mean: a compressor rounds the gradients (fp16, bf16) or approximates them
    (PowerSGD), so only none keeps N x B/N equal to 1 x B."""
    return GRADIENT if settings.compression == "none" else None


def refuse_unless_elementwise(strategy: str, settings: CompressionSettings) -> str | None:
    """For the strategies that compress with ``compress``/``decompress`` only."""
    if not _CLASSES[settings.compression].elementwise:
        return (f"--compression {settings.compression} works with --sync allreduce only (it "
                f"needs an all-reduce between its halves), not --sync {strategy}; use fp16 or "
                "bf16")
    return None


def _compressed_allreduce(compressor: Compressor, bucket) -> torch.futures.Future:
    """DDP's default hook with a compressor around the all-reduce: divide by N, sum."""
    buffer = bucket.buffer()
    wire = compressor.compress(buffer).div_(dist.get_world_size())
    future = dist.all_reduce(wire, async_op=True).get_future()
    return future.then(lambda done: compressor.decompress(done.value()[0], buffer))


def allreduced_bytes(model: nn.Module, compression: str, rank: int) -> int:
    """Bytes of gradient data that enter the allreduce in one steady step (the ring then moves
    2(n-1)/n of them per rank)."""
    return make(compression, rank).sent_bytes(model)
