"""Reduce to one, then broadcast: the hand-written allreduce of Dive into Deep Learning's
"Training on Multiple GPUs" (Zhang et al.).

After backward, every rank sends its gradients (one flat buffer) to rank 0; rank 0 adds them in
rank order, divides by N and sends the average back to every rank. Written with point-to-point
messages on purpose: ``dist.reduce``/``dist.broadcast`` would let the library pick a tree or a
pipelined ring, which is a different algorithm with a different cost. Here the root moves
2(n-1)·S bytes per step, so its time grows with the number of workers.
Nothing overlaps with backward: the whole exchange is the "sync" phase.

With ``--compression fp16|bf16`` every message carries the compressed gradient; the root
decompresses each (its own too, so every rank counts alike), sums in fp32, and compresses the
mean it sends back, using that same rounded mean itself so that all replicas stay equal.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from parascale import lazy
from parascale.sync import compression
from parascale.sync.base import Strategy
from parascale.sync.flat import Flat
from parascale.sync.traits import Pattern, Traits

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist
    from torch import nn
else:  # the registry is read without torch: imported on first use
    torch = lazy.module("torch", globals())
    dist = lazy.module("torch.distributed", globals(), "dist")

ROOT = 0


class ReduceBroadcast(Strategy):
    name = "reduce-broadcast"
    traits = Traits(mean_gradient=True)  # every rank gets the mean back; compressors are casts
    Settings = compression.CompressionSettings
    settings: compression.CompressionSettings

    @classmethod
    def lockstep(cls, settings) -> bool:
        return True

    @classmethod
    def agrees(cls, settings) -> bool:
        return True  # compressors here are casts: no state between steps

    @classmethod
    def equivalence(cls, settings) -> str | None:
        return compression.exact(settings)

    @classmethod
    def pattern(cls, settings) -> Pattern:
        return Pattern(algorithm="root")

    @classmethod
    def refuse(cls, cfg) -> str | None:
        return compression.refuse_unless_elementwise(cls.name, cls.settings_of(cfg))

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = model
        self.flat = Flat(model)
        self.buffer = self.flat.new()
        self.compressor = self.settings.compressor()
        self.incoming: list[torch.Tensor] = []  # the root's receive buffers, one per peer
        n = self.world.size
        sent = self.compressor.bytes_for(self.flat.numel, self.flat.element_size)
        # the root sends the average to n-1 peers; every other rank sends its gradient once
        self.root_sends, self.others_send = (n - 1) * sent, sent
        self.bytes_per_step = self.root_sends if self.world.rank == ROOT else sent
        return model

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        n = self.world.size
        if n == 1:
            return
        squeeze = self.compressor
        grads = self.flat.gather_grads(self.buffer)
        if self.watcher is not None:  # e.g. the noise scale: this rank's gradient, unaveraged
            self.watcher.before_exchange(grads)
        peers = [r for r in range(n) if r != ROOT]
        if self.world.rank == ROOT:
            wire = squeeze.compress(grads)
            if not self.incoming:
                self.incoming = [torch.empty_like(wire) for _ in peers]
            _exchange([dist.P2POp(dist.irecv, buf, r) for buf, r in zip(self.incoming, peers)])
            squeeze.decompress(wire, grads)
            for buf in self.incoming:  # rank order: the same sum on every run
                grads.add_(buf)  # add_ casts a compressed buffer up to the gradient's type
            grads.div_(n)
            wire = squeeze.compress(grads)
            _exchange([dist.P2POp(dist.isend, wire, r) for r in peers])
            squeeze.decompress(wire, grads)
        else:
            wire = squeeze.compress(grads)
            _exchange([dist.P2POp(dist.isend, wire, ROOT)])
            _exchange([dist.P2POp(dist.irecv, wire, ROOT)])
            squeeze.decompress(wire, grads)
        self.flat.scatter_grads(grads)

    def options(self) -> dict:
        return {**super().options(), "root": ROOT,
                "root_sends_bytes_per_step": self.root_sends,
                "others_send_bytes_per_step": self.others_send}


def _exchange(ops: list[dist.P2POp]) -> None:
    for work in dist.batch_isend_irecv(ops):
        work.wait()
