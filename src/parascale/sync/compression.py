"""Gradient compression for the allreduce strategy, through DDP communication hooks.

``none`` is plain averaging (``allreduce_hook``); ``fp16``/``bf16`` cast each bucket to half
precision before the allreduce and back after it (half the bytes, ~3 significant digits for fp16,
~2 for bf16 with fp32's range); ``powersgd`` sends a rank-r approximation P·Qᵀ of each gradient
matrix (Vogels et al. 2019) with error feedback, from the third step on (the first two are plain
allreduces, the minimum torch allows with error feedback and warm start).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

# torch's defaults, used for the byte count below as for the hook itself
POWERSGD_START_ITER = 2
POWERSGD_MIN_COMPRESSION_RATE = 2


def hook_for(compression: str, rank: int) -> tuple[Any, Callable]:
    """(state, hook) for ``DistributedDataParallel.register_comm_hook``."""
    if compression == "fp16":
        return None, default_hooks.fp16_compress_hook
    if compression == "bf16":
        return None, default_hooks.bf16_compress_hook
    if compression == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank,
            start_powerSGD_iter=POWERSGD_START_ITER,
            min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE)
        return state, powerSGD_hook.powerSGD_hook
    return None, default_hooks.allreduce_hook


def allreduced_bytes(model: nn.Module, compression: str, rank: int) -> int:
    """Bytes of gradient data that enter the allreduce in one steady step.

    PowerSGD follows the hook's own rule: each gradient viewed as an (n, m) matrix, r' =
    min(n, m, r), is sent as P (n x r') and Q (m x r') when (n + m)·r'·2 < n·m, otherwise
    whole (biases always). The ring then moves 2(n-1)/n of these bytes per rank.
    """
    total = 0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        size = p.element_size()
        if compression in ("fp16", "bf16"):
            total += p.numel() * 2
        elif compression == "powersgd":
            n = p.shape[0] if p.dim() else 1
            m = p.numel() // max(n, 1)
            r = min(n, m, rank)
            compressed = (n + m) * r
            worth = compressed * POWERSGD_MIN_COMPRESSION_RATE < n * m
            total += (compressed if worth else n * m) * size
        else:
            total += p.numel() * size
    return total
