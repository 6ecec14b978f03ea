"""Several learners (model replicas) on one device, trained as one module (``--sync sma``).

The trainer steps one module with one SGD optimizer on the device's batch; a learners module
gives learner j the rows ``[j*B, (j+1)*B)`` of it and returns their outputs in the same order.
One SGD over every learner's parameters is M independent momentum-SGD learners, because
momentum and weight decay act element by element. Two engines:

- ``loop``: M replicas run one after another (each keeps its own batch-norm statistics).
- ``vmap``: the M learners' parameters stacked along a first dimension and run as one batched
  computation per layer (``torch.func.functional_call`` under ``torch.func.vmap``); batch-norm
  statistics are stacked too, so each learner still keeps its own.

Measured on 2 vCPUs (``benchmarks/learners.py``, RESULTS-learners.md): with one or two learners
vmap is slower (0.44-0.83x with one thread, 0.48-1.02x with two: its batching costs more than it
saves); with four it is 0.89-1.16x with one thread and 1.35-1.51x with two. So ``auto`` (the
default) runs vmap from four learners on and the loop below; ``--sync-option
learner_engine=loop|vmap`` insists on one. On a GPU the loop runs each learner on a CUDA stream
of its own (untested here: this machine has no GPU).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

ENGINES = ("loop", "vmap")
VMAP_FROM = 4  # learners per device from which ``auto`` chooses vmap (benchmarks/learners.py)


class Learners(nn.Module):
    """M learners behind one forward; their parameters as rows of one (M, P) matrix."""

    count: int

    def rows(self, x: torch.Tensor) -> int:
        if len(x) % self.count:
            raise ValueError(f"a batch of {len(x)} rows does not split over {self.count} learners")
        return len(x) // self.count

    def vectors(self) -> torch.Tensor:
        """(M, P): each learner's parameters, flattened in the model's parameter order."""
        raise NotImplementedError

    def set_vectors(self, values: torch.Tensor) -> None:
        raise NotImplementedError

    def buffer_tensors(self) -> list[torch.Tensor]:
        """For each of the model's buffers, every learner's copy: (M, *shape)."""
        raise NotImplementedError


class LoopLearners(Learners):
    def __init__(self, model: nn.Module, count: int):
        super().__init__()
        self.count = count
        self.replicas = nn.ModuleList(copy.deepcopy(model) for _ in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.rows(x)
        if x.is_cuda and self.count > 1:
            return self._on_streams(x, b)
        return torch.cat([r(x[j * b:(j + 1) * b]) for j, r in enumerate(self.replicas)])

    def _on_streams(self, x: torch.Tensor, b: int) -> torch.Tensor:
        """On a GPU each learner runs on a CUDA stream of its own, so that small batches can
        overlap on the device (Crossbow's point). Autograd runs each backward operation on the
        stream of its forward one, so backward overlaps too; the current stream waits for every
        learner before their outputs are joined."""
        current = torch.cuda.current_stream(x.device)
        if not hasattr(self, "_streams"):
            self._streams = [torch.cuda.Stream(x.device) for _ in range(self.count)]
        outputs = []
        for j, (replica, stream) in enumerate(zip(self.replicas, self._streams)):
            stream.wait_stream(current)  # x is ready
            with torch.cuda.stream(stream):
                rows = x[j * b:(j + 1) * b]
                rows.record_stream(stream)
                outputs.append(replica(rows))
        for stream, out in zip(self._streams, outputs):
            current.wait_stream(stream)
            out.record_stream(current)
        return torch.cat(outputs)

    def vectors(self) -> torch.Tensor:
        return torch.stack([nn.utils.parameters_to_vector(r.parameters()).detach()
                            for r in self.replicas])

    @torch.no_grad()
    def set_vectors(self, values: torch.Tensor) -> None:
        for replica, row in zip(self.replicas, values):
            nn.utils.vector_to_parameters(row.clone(), replica.parameters())

    def buffer_tensors(self) -> list[torch.Tensor]:
        return [torch.stack(copies) for copies in zip(*(r.buffers() for r in self.replicas))]


class StackedLearners(Learners):
    def __init__(self, model: nn.Module, count: int):
        super().__init__()
        self.count = count
        # the structure only: every tensor it computes with is passed in, stacked
        self.base = copy.deepcopy(model).to("meta")
        self.param_names = [name for name, _ in model.named_parameters()]
        self.buffer_names = [name for name, _ in model.named_buffers()]
        self.stacked = nn.ParameterList(nn.Parameter(_stack(p, count))
                                        for p in model.parameters())
        for i, buffer in enumerate(model.buffers()):
            self.register_buffer(f"buffer{i}", _stack(buffer, count))

    def _buffers_stacked(self) -> list[torch.Tensor]:
        return [getattr(self, f"buffer{i}") for i in range(len(self.buffer_names))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.func import functional_call, vmap

        b = self.rows(x)

        def one(params, buffers, rows):
            state = {**dict(zip(self.param_names, params)),
                     **dict(zip(self.buffer_names, buffers))}
            return functional_call(self.base, state, (rows,))

        out = vmap(one, randomness="different")(list(self.stacked), self._buffers_stacked(),
                                                x.reshape(self.count, b, *x.shape[1:]))
        return out.reshape(self.count * b, *out.shape[2:])

    def vectors(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(self.count, -1) for p in self.stacked], dim=1)

    @torch.no_grad()
    def set_vectors(self, values: torch.Tensor) -> None:
        offset = 0
        for p in self.stacked:
            n = p[0].numel()
            p.copy_(values[:, offset:offset + n].reshape(p.shape))
            offset += n

    def buffer_tensors(self) -> list[torch.Tensor]:
        return self._buffers_stacked()


def _stack(tensor: torch.Tensor, count: int) -> torch.Tensor:
    return tensor.detach().unsqueeze(0).repeat(count, *([1] * tensor.dim())).clone()


def engine_for(count: int, asked: str = "auto") -> str:
    """The engine ``asked`` for, or for ``auto`` the faster one measured for ``count``."""
    if asked == "auto":
        return "vmap" if count >= VMAP_FROM else "loop"
    if asked not in ENGINES:
        raise ValueError(f"unknown learner engine {asked!r}; choose from auto, "
                         f"{', '.join(ENGINES)}")
    return asked


def make_learners(model: nn.Module, count: int, engine: str = "auto") -> Learners:
    """``count`` learners, each starting as an exact copy of ``model``'s parameters and
    buffers, run by ``engine`` (``loop``, ``vmap`` or ``auto``: see :func:`engine_for`)."""
    chosen = engine_for(count, engine)
    return (LoopLearners if chosen == "loop" else StackedLearners)(model, count)
