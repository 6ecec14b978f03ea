"""Ring allreduce through DistributedDataParallel: bucketed and overlapped with backward."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.sync import compression
from parascale.sync.base import NOTHING, Strategy
from parascale.sync.options import Settings, option
from parascale.sync.traits import GRADIENT, Pattern, Traits

if TYPE_CHECKING:
    import torch
    import torch.nn.parallel as parallel
    from torch import nn
else:  # the registry is read without torch: imported on first use
    torch = lazy.module("torch", globals())
    parallel = lazy.module("torch.nn.parallel", globals())
    nn = lazy.module("torch.nn", globals())


class _BucketClock:
    """State of the timing hook: when the last gradient bucket of this backward was ready."""

    def __init__(self, state: Any, hook, cuda: bool, owner: Strategy):
        self.state, self.hook, self.cuda, self.owner = state, hook, cuda, owner
        self.last: Any = None

    def take(self) -> Any:
        last, self.last = self.last, None
        return last


def _timed_hook(clock: _BucketClock, bucket):
    """Note when the bucket became ready, then run the real (possibly compressing) hook.

    DDP calls the hook of bucket i once all its gradients are computed, and launches buckets in
    order, so the last call of a backward is the moment the last gradient is ready: compute is
    over, and what backward still waits for after it is communication left exposed.
    """
    if clock.cuda:
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the backward stream: completes once the bucket's gradients exist
        clock.last = event
    else:
        clock.last = time.perf_counter()
    if clock.owner.watcher is not None:  # e.g. the noise scale: the gradient before averaging
        clock.owner.watcher.before_exchange(bucket.buffer())
    return clock.hook(clock.state, bucket)


@dataclass(frozen=True)
class BucketSettings(Settings):
    bucket_mb: float = option(25.0, "DDP's gradient bucket size in MiB.", minimum=1e-3,
                              flag=True)


class Bucketed(Strategy):
    """DDP's bucketed allreduce of the gradients as they are, overlapped with backward: the
    base of ``allreduce`` and ``zero`` (it is no strategy of its own: not registered)."""

    name = "bucketed"
    traits = Traits(mean_gradient=True)
    Settings = BucketSettings
    settings: BucketSettings

    @classmethod
    def lockstep(cls, settings) -> bool:
        return True

    @classmethod
    def agrees(cls, settings) -> bool:
        return True

    @classmethod
    def equivalence(cls, settings) -> str | None:
        return GRADIENT  # DDP averages the gradients as they are

    @classmethod
    def pattern(cls, settings) -> Pattern:
        return Pattern(overlaps=True)

    def compressor(self) -> compression.Compressor:
        """What the gradients are sent as: themselves."""
        return compression.Compressor()

    def wrap(self, model: nn.Module) -> nn.Module:
        self._clock: _BucketClock | None = None
        self._ddp: parallel.DistributedDataParallel | None = None
        compressor = self.compressor()
        if self.world.size == 1 and compressor.name == "none":
            # nothing to average with: DDP's hook, bucket copies and one-rank allreduce are
            # work that changes no number (a compressor would: it rounds even alone, so
            # compressed runs keep DDP and stay what they were)
            self.model = model
            self.bytes_per_step = 0
            return model
        device_ids = [self.world.device] if self.world.device.type == "cuda" else None
        ddp = parallel.DistributedDataParallel(model, device_ids=device_ids,
                                               bucket_cap_mb=self.settings.bucket_mb)
        state, hook = compressor.ddp_hook()
        self._clock = _BucketClock(state, hook, self.world.device.type == "cuda", self)
        ddp.register_comm_hook(self._clock, _timed_hook)
        self.model = self._ddp = ddp
        n = self.world.size
        # ring allreduce: every rank sends 2(n-1)/n of the bytes that enter the allreduce
        self.bytes_per_step = int(2 * (n - 1) / n * compressor.sent_bytes(model))
        return self.model

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        # gradients of non-final micro-batches stay local; the last backward reduces the sum
        if last or self._ddp is None:
            return NOTHING
        return self._ddp.no_sync()

    def compute_end(self) -> Any | None:
        return None if self._clock is None else self._clock.take()


@dataclass(frozen=True)
class AllReduceSettings(compression.CompressionSettings, BucketSettings):
    pass


class AllReduce(Bucketed):
    """DDP. Gradients are averaged in buckets of ``--bucket-mb`` while backward still runs, so
    most communication hides behind compute; what does not (the allreduce of the last bucket,
    and any bucket still queued when the last gradient is ready) is the "sync" phase."""

    name = "allreduce"
    Settings = AllReduceSettings
    settings: AllReduceSettings

    @classmethod
    def equivalence(cls, settings: AllReduceSettings) -> str | None:
        return compression.exact(settings)

    @classmethod
    def refuse(cls, cfg) -> str | None:
        settings = cls.settings_of(cfg)
        if settings.compression == "powersgd" and (cfg.checkpoint.checkpoint_every is not None
                                                   or cfg.checkpoint.resume):
            return ("--compression powersgd keeps error feedback per DDP bucket, which a "
                    "checkpoint does not hold; checkpoint with --compression none, fp16 or bf16")
        return None

    @classmethod
    def resumes_resized(cls, cfg) -> bool:
        # the model and optimizer are kept once (replicas_agree); DDP keeps nothing between
        # steps, nor do the casting compressors (PowerSGD is refused with checkpoints)
        return True

    def compressor(self) -> compression.Compressor:
        """What the gradients are sent as (``--compression``)."""
        return self.settings.compressor()

    def noise_refusal(self) -> str | None:
        if self.compressor().name == "powersgd":
            return ("--compression powersgd averages a low-rank approximation of the gradients, "
                    "not their mean; measure the noise scale with --compression none")
        return None
