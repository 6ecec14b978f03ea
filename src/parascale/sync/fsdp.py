"""Fully sharded data parallelism through FSDP2's ``fully_shard``: each rank keeps 1/N of the
gradients and optimizer state (ZeRO stage 2) and, at stage 3, of the parameters between uses.

Parameters become DTensors sharded along their first dimension; forward all-gathers each wrapped
unit's parameters, backward reduce-scatters their gradients, and the optimizer updates only this
rank's shards. Stage 3 frees the gathered parameters after forward and gathers them again in
backward (one more all-gather per step); stage 2 keeps them until backward ends.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from parascale import lazy
from parascale.errors import KnownFailure
from parascale.sync.base import Strategy, unwrap
from parascale.sync.options import Settings, option
from parascale.sync.traits import GRADIENT, SHARDABLE, Pattern, Traits

if TYPE_CHECKING:
    import torch
    import torch.distributed.device_mesh as device_mesh
    import torch.distributed.fsdp as fsdp
    import torch.distributed.tensor as tensor_api
    from torch import nn

    from parascale.models import deferred
else:  # the registry is read without torch: imported on first use
    torch = lazy.module("torch", globals())
    device_mesh = lazy.module("torch.distributed.device_mesh", globals())
    fsdp = lazy.module("torch.distributed.fsdp", globals())
    tensor_api = lazy.module("torch.distributed.tensor", globals(), "tensor_api")
    nn = lazy.module("torch.nn", globals())
    deferred = lazy.module("parascale.models.deferred", globals())


def units(model: nn.Module) -> list[nn.Module]:
    """The submodules to shard as units of their own, before the model itself: the items of
    every ModuleList (a transformer's blocks), else the model's children that hold parameters.
    Each unit's parameters are gathered only while it computes, so the peak holds one unit's
    whole parameters at a time, not the model's."""
    listed = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst
              if any(True for _ in m.parameters())]
    if listed:
        return listed
    return [m for m in model.children() if any(True for _ in m.parameters())]


def groups(model: nn.Module) -> list[list[nn.Module]]:
    """The units (:func:`units`) as FSDP shards them: units that share a parameter (tied
    weights) go into one group, whose parameters are gathered together; a unit that shares one
    with the part of the model outside every unit is left to the model's own group."""
    found = units(model)
    owned = [{id(p) for p in u.parameters()} for u in found]
    inside = {id(m) for u in found for m in u.modules()}
    rest = {id(p) for m in model.modules() if id(m) not in inside
            for p in m.parameters(recurse=False)}
    merged: list[tuple[list[nn.Module], set[int]]] = []
    for unit, params in zip(found, owned):
        if params & rest:
            continue
        members, ids = [unit], params
        for group in [g for g in merged if g[1] & ids]:
            merged.remove(group)
            members, ids = group[0] + members, group[1] | ids
        merged.append((members, ids))
    return [members for members, _ in merged]


def cannot_shard(model: nn.Module) -> str | None:
    """Why FSDP cannot shard ``model``, in words, or None."""
    params = list(model.parameters())
    if not params:
        return "the model has no parameters to shard"
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        return (f"its parameters mix dtypes ({', '.join(sorted(map(str, dtypes)))}); FSDP "
                "shards a unit's parameters as one flat buffer of one dtype")
    if not all(p.dtype.is_floating_point for p in params):
        return f"its parameters are {params[0].dtype}, not floating point"
    return None


def _refusal(model: nn.Module, why: str) -> str:
    return (f"--sync fsdp cannot shard {type(model).__name__}: {why}; change the model, or use "
            "--sync zero, which shards the optimizer state alone")


def _fill(target: torch.Tensor, whole: torch.Tensor) -> None:
    """``target``'s part of ``whole``: its shard, where FSDP made it a DTensor (a parameter),
    else all of it (a buffer, which FSDP keeps whole on every rank)."""
    if isinstance(target, tensor_api.DTensor):
        part = tensor_api.distribute_tensor(whole, target.device_mesh, target.placements,
                                            src_data_rank=None)  # cut here: nothing is sent
        target.to_local().copy_(part.to_local())
    else:
        target.copy_(whole)


@dataclass(frozen=True)
class FSDPSettings(Settings):
    stage: int = option(3, "FSDP: 3 shards the parameters too, freeing them after forward and "
                        "gathering them again in backward; 2 keeps them gathered from forward "
                        "to the end of backward.", minimum=2)


class FSDP(Strategy):
    """FSDP2. Communication happens inside forward and backward (all-gather, reduce-scatter),
    so it counts as compute in the step phases; the update is local to each rank's shards."""

    name = "fsdp"
    # between steps each rank holds its shards of all three (stage 2 gathers the parameters
    # from forward to the end of backward only); each writes its shards, any count reads them
    traits = Traits(shards=frozenset(SHARDABLE), shards_checkpoint=True,
                    script_refusal="it shards the parameters, which the script's own saving "
                                   "and evaluation would see in pieces")
    Settings = FSDPSettings
    settings: FSDPSettings

    @classmethod
    def lockstep(cls, settings) -> bool:
        return True

    @classmethod
    def equivalence(cls, settings) -> str | None:
        return GRADIENT  # each rank steps its shards on the reduce-scattered mean gradient

    @classmethod
    def pattern(cls, settings: FSDPSettings) -> Pattern:
        # an all-gather of the parameters in forward and a reduce-scatter of the gradients in
        # backward; stage 3 gathers the parameters again in backward
        return Pattern(overlaps=True, passes=3 if settings.stage == 3 else 2,
                       stage=settings.stage, in_compute=True)

    @classmethod
    def stages(cls) -> dict[int, dict[str, Any]]:
        return {2: {"stage": 2}, 3: {"stage": 3}}

    @classmethod
    def refuse(cls, cfg) -> str | None:
        stage = cls.settings_of(cfg).stage
        if stage not in (2, 3):
            return f"--sync-option stage={stage}: FSDP shards at stage 2 or 3"
        if cfg.optim.clip_grad_norm is not None:
            return ("--sync fsdp shards the gradients: each rank's norm is of its shard alone, "
                    "so --clip-grad-norm would clip by the wrong norm; leave it out")
        if cfg.strategy.precision == "fp16":
            return ("--sync fsdp runs mixed precision in bf16 (fp16 would need a sharded "
                    "gradient scaler); use --precision bf16")
        return None

    @classmethod
    def refuse_model(cls, cfg, model: nn.Module, workers: int) -> str | None:
        why = cannot_shard(unwrap(model)) if workers > 1 else None
        return None if why is None else _refusal(unwrap(model), why)

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.stage = self.settings.stage
        self._full_state: dict[str, Any] | None = None
        self._evaluating = False

    def wrap(self, model: nn.Module) -> nn.Module:
        self.model = model
        n = self.world.size
        if n == 1:  # one rank holds every shard anyway
            if self.world.is_main:
                print("parascale: --sync fsdp on one worker: nothing to shard, the model, its "
                      "gradients and optimizer state are whole (as under --sync allreduce)",
                      flush=True)
            self.bytes_per_step = 0
            return model
        plain = unwrap(model)  # torch.compile's wrapper calls the module sharded in place
        why = cannot_shard(plain)
        if why:  # a launcher other than parascale's: the workers meet it first, in one line
            raise KnownFailure(_refusal(plain, why))
        mesh = device_mesh.init_device_mesh(self.world.device.type, (n,))
        kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": self.stage == 3}
        if self.cfg.strategy.precision == "bf16":  # GPUs and CPU workers; the reduction in fp32
            kw["mp_policy"] = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
        try:
            for group in groups(plain):
                fsdp.fully_shard(group if len(group) > 1 else group[0], **kw)
            fsdp.fully_shard(plain, **kw)
        except (ValueError, RuntimeError, TypeError, AssertionError) as exc:
            raise KnownFailure(_refusal(plain, str(exc).splitlines()[0] if str(exc)
                                        else type(exc).__name__)) from exc
        if deferred.recipe_of(plain) is not None:  # built without storage: this rank's shards
            deferred.materialise(plain, self.world.device, _fill)
        size = sum(p.numel() * p.element_size() for p in plain.parameters())
        # reduce-scatter of the gradients, all-gather of the parameters in forward, and at
        # stage 3 again in backward: each moves (N-1)/N of the bytes per rank
        self.bytes_per_step = int((3 if self.stage == 3 else 2) * (n - 1) / n * size)
        return model

    def _fsdp_modules(self) -> list[fsdp.FSDPModule]:
        return [m for m in unwrap(self.model).modules() if isinstance(m, fsdp.FSDPModule)]

    def accumulating(self, last: bool) -> contextlib.AbstractContextManager:
        modules = self._fsdp_modules()
        if self._evaluating:  # back to training: the stage says when to free the parameters
            for m in modules:
                m.set_reshard_after_forward(self.stage == 3, recurse=False)
            self._evaluating = False
        if modules:  # non-final micro-batches keep their gradients unreduced
            modules[0].set_requires_gradient_sync(last)  # the model's, and its units'
        return contextlib.nullcontext()

    @property
    def evaluates_in_lockstep(self) -> bool:
        return bool(self._fsdp_modules())

    def before_evaluation(self) -> None:
        """Evaluate as stage 3 trains, whatever the stage: each unit gathered for its forward
        and freed after it, so evaluation never holds the whole model (every rank makes as many
        forward passes: ``evaluates_in_lockstep``)."""
        super().before_evaluation()
        modules = self._fsdp_modules()
        for m in modules:
            m.set_reshard_after_forward(True, recurse=False)
        self._evaluating = bool(modules)

    def finish(self) -> None:
        """Gather the whole model for model.pt (collective; rank 0 keeps it), where the run
        writes one: rank 0 then holds the whole model, which a run without one never does."""
        if not self._fsdp_modules() or not self.cfg.output.save_model:
            return
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_model_state_dict)

        self._full_state = get_model_state_dict(
            unwrap(self.model), options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def model_state_dict(self) -> dict[str, Any]:
        return self._full_state if self._full_state is not None else super().model_state_dict()

    def options(self) -> dict:
        return {**super().options(), "stage": self.stage, "sharded": self.world.size > 1,
                "units": len(self._fsdp_modules())}
