"""What ``parascale comm`` measures and how it is described: the operations, message sizes and
their notation, the bus-bandwidth factor of each operation, and the checked configuration.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from parascale.errors import UsageError
from parascale.record import COMM_NAME as RECORD_NAME  # noqa: F401 (comm's own names)
from parascale.record import COMM_SCHEMA as SCHEMA  # noqa: F401

OPS = ("allreduce", "broadcast", "reduce", "all_gather")
DEFAULT_SIZES = tuple(1024 * 4 ** i for i in range(10))  # 1 KiB .. 256 MiB
ELEMENT_BYTES = 4  # float32
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMG]?)(?:I?B)?", re.IGNORECASE | re.ASCII)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for ``n`` ranks."""
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    return 1.0


def parse_size(text: str) -> int:
    """'1K' -> 1024, '64M' -> 67108864, '512' -> 512: powers of 1024, a trailing B or iB allowed."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--sizes: cannot read {text!r}; use bytes with an optional K, M or G "
                         "suffix (powers of 1024), e.g. 1K,1M,64M")
    size = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if size < ELEMENT_BYTES or size != int(size):
        raise UsageError(f"--sizes: {text!r} is {size:g} bytes; each size must be a whole number "
                         f"of at least {ELEMENT_BYTES} bytes (one float32)")
    return int(size)


def format_size(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return f"{size}B" if size < 1024 else f"{size / 1024:.1f}K"


@dataclass
class CommConfig:
    workers: int | None = None
    """CPU worker processes (default one per core); under torchrun/srun, the launcher's world."""
    gpus: tuple[int, ...] | None = None
    """CUDA device indices, one worker each (NCCL)."""
    sizes: tuple[int, ...] = DEFAULT_SIZES
    """Message sizes in bytes."""
    ops: tuple[str, ...] = OPS
    """Collectives to time."""
    warmup: int = 2
    """Untimed iterations before each measurement."""
    iters: int = 50
    """Most timed iterations per operation and size (fewer when an iteration is slow)."""
    min_iters: int = 5
    """Fewest timed iterations per operation and size."""
    seconds_per_point: float = 0.3
    """Time budget that picks the iteration count between min_iters and iters."""
    timeout: float = 120.0
    """Seconds a collective may wait before the job is declared stuck."""
    port: int | None = None
    """Port of the local launch's rendezvous store (loopback); default: a free one."""
    oversubscribe: bool = False
    """Run more workers than 4 per core (otherwise refused)."""
    out: str | None = None
    """Folder for comm.json."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("sizes", "ops", "gpus"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommConfig:
        data = dict(data)
        for key in ("sizes", "ops", "gpus"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)


def validate(cfg: CommConfig, size: int) -> None:
    if size < 2:
        raise UsageError(f"parascale comm needs at least 2 workers (a collective on one process "
                         f"moves nothing); got {size}")
    unknown = [op for op in cfg.ops if op not in OPS]
    if unknown or not cfg.ops:
        raise UsageError(f"--ops: unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                         f"choose from {', '.join(OPS)}")
    if not cfg.sizes:
        raise UsageError("--sizes needs at least one size, e.g. 1K,1M")
    for name in ("iters", "min_iters"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, "
                             f"got {getattr(cfg, name)}")
    if cfg.warmup < 0:
        raise UsageError(f"--warmup must be 0 or more, got {cfg.warmup}")
    if cfg.min_iters > cfg.iters:
        raise UsageError(f"--min-iters {cfg.min_iters} is more than --iters {cfg.iters}")
    if not cfg.timeout > 0:
        raise UsageError(f"--timeout must be positive, got {cfg.timeout}")
    if cfg.gpus is not None and cfg.workers is not None and cfg.workers != len(cfg.gpus):
        raise UsageError(f"--workers {cfg.workers} does not match --gpus "
                         f"{','.join(map(str, cfg.gpus))} (one worker per GPU)")


def iterations_for(estimate_s: float, cfg: CommConfig) -> int:
    """As many iterations as fit the time budget, within [min_iters, iters]."""
    if estimate_s <= 0:
        return cfg.iters
    return max(cfg.min_iters, min(cfg.iters, math.ceil(cfg.seconds_per_point / estimate_s)))
