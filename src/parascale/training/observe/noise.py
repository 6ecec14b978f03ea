"""The gradient noise scale, B_simple = tr(Σ)/|G|², measured while training (McCandlish et al.,
"An Empirical Model of Large-Batch Training", 2018, appendix A).

A strategy that averages gradients has both of the paper's batch sizes in every step: rank i's
gradient g_i over its b = per-device batch x accumulation samples, before the exchange, and their
mean G_B over the global batch B = N·b, after it. With E|g_i|² = |G|² + tr(Σ)/b and
E|G_B|² = |G|² + tr(Σ)/B, the unbiased estimators are

    |G|² ≈ (B·|G_B|² − b·|g|²) / (B − b)        tr(Σ) ≈ (|g|² − |G_B|²) / (1/b − 1/B)

where |g|² is the mean of the ranks' |g_i|². Each is far too noisy in one step; like the paper we
average numerator and denominator over steps (here: an epoch's steps) and take the ratio of the
averages. The uncertainty is a jackknife over blocks of steps.

Cost: two squared norms per step, kept on the device (no synchronisation in the step: .item()
would wait for a GPU), and one all_gather of a few floats per step at the epoch's end. The issue
asked for a scalar allreduce per step; the epoch's one gather gives the same numbers and adds no
synchronisation point to a strategy's step.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from parascale import precision, sync
from parascale.sync.base import unwrap

BLOCKS = 10  # jackknife blocks of steps


def estimate(local_sq: torch.Tensor, global_sq: torch.Tensor, small: int, big: int,
             population: int | None = None) -> dict[str, Any]:
    """The epoch's figures from ``local_sq`` (steps x ranks: each rank's |g_i|² before the
    exchange) and ``global_sq`` (steps: |G_B|² after it), batches ``small`` = b and ``big`` = B.

    ``population``: the n training samples the batches are drawn from without replacement (an
    epoch's permutation). A mean of m of them then varies by tr(Σ)/m·(n−m)/(n−1), not tr(Σ)/m,
    and the two-batch estimators return |G|² − T/n and T = n·tr(Σ)/(n−1) instead; undoing that
    is exact: |G|² = est + T/n, tr(Σ) = T·(n−1)/n. Without it (None) the paper's formulas stand,
    which assume independent draws: they overstate B_simple by a share of about B_simple/n.

    ``noise_scale`` is None (with a ``noise_note``) when an estimate is not positive: for |G|²
    the gradient's noise swamps its mean at these batches; for tr(Σ), the big batch's gradient
    came out no smaller than the small one's, which too few steps can do. Either way the ratio
    means nothing.
    """
    small_sq = local_sq.double().mean(dim=1)
    big_sq = global_sq.double()
    grad_sq = (big * big_sq - small * small_sq) / (big - small)
    trace = (small_sq - big_sq) / (1 / small - 1 / big)
    if population is not None:
        grad_sq = grad_sq + trace / population
        trace = trace * (population - 1) / population
    steps = int(grad_sq.numel())
    out: dict[str, Any] = {"noise_scale": None, "noise_scale_se": None,
                           "grad_sq": float(grad_sq.mean()), "trace_sigma": float(trace.mean()),
                           "noise_steps": steps}
    if not out["grad_sq"] > 0:  # also NaN
        out["noise_note"] = (f"the estimated |G|² is not positive over {steps} step(s): the "
                             "gradient's noise swamps its mean at these batches")
        return out
    if not out["trace_sigma"] > 0:
        out["noise_note"] = (f"the estimated tr(Σ) is not positive over {steps} step(s): too "
                             "few steps to tell the noise from chance")
        return out
    out["noise_scale"] = out["trace_sigma"] / out["grad_sq"]
    out["noise_scale_se"] = _jackknife(trace, grad_sq)
    return out


def _jackknife(trace: torch.Tensor, grad_sq: torch.Tensor) -> float | None:
    """Standard error of mean(trace)/mean(grad_sq), leaving out one block of steps at a time
    (blocks, not single steps: neighbouring steps are correlated)."""
    blocks = min(BLOCKS, trace.numel())
    if blocks < 2:
        return None
    ratios = []
    for left_out in torch.arange(trace.numel()).tensor_split(blocks):
        keep = torch.ones(trace.numel(), dtype=torch.bool)
        keep[left_out] = False
        denominator = grad_sq[keep].mean()
        if denominator <= 0:
            return None  # one block decides the sign: too few steps to say how sure it is
        ratios.append(float(trace[keep].mean() / denominator))
    mean = sum(ratios) / blocks
    return math.sqrt((blocks - 1) / blocks * sum((r - mean) ** 2 for r in ratios))


def advice(noise_scale: float, global_batch: int) -> str:
    """What the estimate means for the batch: steps ≈ S_min·(1 + B_noise/B) (the paper's eq. 2.11),
    so below B_noise a larger batch still cuts steps almost in proportion; beyond it, little."""
    about = _round(noise_scale)
    if global_batch > noise_scale:
        now = (f"this run's global batch of {global_batch:,} is beyond it already: more workers "
               "at this per-device batch will save few steps")
    else:
        now = (f"this run's global batch of {global_batch:,} is below it: larger batches still "
               "cut the steps needed almost in proportion")
    return f"batches beyond about {about:,} give diminishing returns for this model now; {now}"


def said(figures: dict[str, Any], global_batch: int) -> str:
    """The advice of an epoch's ``figures`` where they are precise enough to carry it
    (:mod:`parascale.precision`); otherwise why not, and about how many steps would do. Four
    steps of vgg16 gave "1 ± 4" and advised on the batch from it."""
    verdict = precision.judge(figures["noise_scale"], figures.get("noise_scale_se"),
                              figures.get("noise_steps"))
    if verdict.precise:
        return advice(figures["noise_scale"], global_batch)
    return verdict.reason("the noise scale")


def _round(value: float) -> int:
    """Two significant figures: the estimate is not surer than that."""
    if value < 10:
        return max(1, round(value))
    digits = math.floor(math.log10(value)) - 1
    return int(round(value, -digits))


class NoiseScale:
    """The loop's measurement: ``observe`` after every step's exchange, ``end_epoch`` (collective)
    for the epoch entry's figures, ``summary`` for the record's ``noise`` section."""

    def __init__(self, cfg, world, strategy, plan, scaler, population: int | None = None):
        self.world, self.strategy, self.population = world, strategy, population
        derived = plan.derived
        self.small = derived.per_device_batch * cfg.batch.accumulate
        self.big = derived.global_batch
        self.reason = _why_not(cfg, world, strategy, scaler)
        self._local: torch.Tensor | None = None  # this step's |g_i|² so far (DDP: per bucket)
        if self.reason is None:
            strategy.watch_gradients(self)
        self.rows: list[torch.Tensor] = []  # per step: (this rank's |g_i|², |G_B|²)
        self.last: dict[str, Any] | None = None  # the newest epoch's estimate

    @property
    def measuring(self) -> bool:
        return self.reason is None

    def before_exchange(self, gradients: torch.Tensor) -> None:
        """The strategy shows this rank's own gradients (all, or one DDP bucket of them)."""
        sq = torch.linalg.vector_norm(gradients).double() ** 2
        self._local = sq if self._local is None else self._local + sq

    def observe(self) -> None:
        """After ``synchronize``: both squared norms of this step, left on the device."""
        if not self.measuring:
            return
        local, self._local = self._local, None
        grads = [p.grad for p in unwrap(self.strategy.model).parameters() if p.grad is not None]
        if local is None or not grads:
            return
        averaged = torch.nn.utils.get_total_norm(grads) ** 2
        self.rows.append(torch.stack([local.double(), averaged.double()]))

    def part(self) -> torch.Tensor:
        """This rank's rows of the epoch in progress, for a checkpoint."""
        return torch.stack(self.rows).cpu() if self.rows else torch.zeros(0, 2)

    def restore(self, rows: torch.Tensor | None) -> None:
        if rows is not None and self.measuring:
            self.rows = [r.to(self.world.device) for r in rows]

    def end_epoch(self, epoch: int) -> dict[str, Any]:
        """Collective when measuring: the epoch entry's noise figures (``noise_scale`` None, with
        no other key, when not measured)."""
        rows, self.rows = self.rows, []
        if not self.measuring:
            return {"noise_scale": None}
        mine = torch.stack(rows) if rows else torch.zeros(0, 2, dtype=torch.float64,
                                                          device=self.world.device)
        gathered = [torch.empty_like(mine) for _ in range(self.world.size)]
        dist.all_gather(gathered, mine)  # every rank took the same steps: equal shapes
        if mine.shape[0] == 0:
            return {"noise_scale": None, "noise_note": "no step measured in this epoch"}
        local = torch.stack([g[:, 0] for g in gathered], dim=1).cpu()
        figures = estimate(local, mine[:, 1].cpu(), self.small, self.big, self.population)
        if figures["noise_scale"] is not None:
            self.last = {"epoch": epoch, **figures}
        return figures

    def summary(self) -> dict[str, Any]:
        """The record's ``noise`` section (docs/record.md)."""
        last = self.last or {}
        value = last.get("noise_scale")
        return {"measured": self.measuring, "reason": self.reason,
                "per_device_batch": self.small, "global_batch": self.big,
                "noise_scale": value, "noise_scale_se": last.get("noise_scale_se"),
                "epoch": last.get("epoch"),
                "steps": last.get("noise_steps"),
                "advice": said(last, self.big) if value is not None else None}

    def line(self) -> str | None:
        """Rank 0's closing line on the estimate, or None when there is none."""
        if self.last is None:
            return None
        value, se = self.last["noise_scale"], self.last["noise_scale_se"]
        spread = f" ± {se:,.0f}" if se is not None else ""
        return (f"parascale: gradient noise scale {value:,.0f}{spread} samples in epoch "
                f"{self.last['epoch']}: {said(self.last, self.big)}")


def _why_not(cfg, world, strategy, scaler) -> str | None:
    """Why this run cannot measure the noise scale, or None when it can."""
    if not cfg.measure.noise_scale:
        return "turned off with --no-noise-scale"
    if world.size == 1:
        return ("one worker has one batch size; the estimate compares the per-device batch's "
                "gradient with the global batch's, so it needs 2 or more workers")
    if scaler is not None:
        return ("fp16's loss scale changes the gradients' size from step to step; measure the "
                "noise scale in fp32 or bf16")
    return sync.noise_refusal(strategy)
