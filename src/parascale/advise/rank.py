"""The ranking and the recommendation: the fastest configuration to the goal, the cheapest in
device-hours when it is another, and what limits the fastest, in words.

The recommendation is the fastest configuration whose steps the noise-scale model covers: a
strategy variant that steps on the global batch's mean gradient (its declared
``equivalence``). A variant that does not (compression, a period of local steps) is predicted
as if it did, which it is not; when one is predicted faster it is named beside the
recommendation, as a candidate to measure (``--verify``), not recommended.

Among configurations predicted within ``TIE`` of the fastest (closer than the predictions
can tell apart: each time rests on a noise scale and step times measured briefly), the one
whose band ends lowest is recommended: as fast as far as the advice can say, and the least at
risk where the inputs are at their worst. The steps at a global batch far from the pilot's
rest most on the noise scale, whose growth during training makes them come out low, so those
bands are the widest.

A noise scale too imprecise to carry the steps at other global batches (``parascale.precision``,
the rule training, ``report`` and ``predict`` share) withholds the recommendation: the table is
still shown, but the advice says why it recommends nothing and how many steps would do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parascale import precision
from parascale.advise.forecast import Basis, Forecast

#: an exposed exchange this share of the step or more is named as a limit
LINK_SHARE = 0.2
#: a contention factor of at least this is named as a limit
CONTENTION = 1.15
#: predicted times within this share of the fastest are a tie, decided by the band's high end
TIE = 0.05


@dataclass
class Advice:
    basis: Basis
    forecasts: list[Forecast]
    """Ranked: the feasible by time to the goal, then the others."""
    rule: str
    goal: str
    space: dict[str, Any]
    recommended: Forecast | None = None
    cheapest: Forecast | None = None
    limits: list[str] = field(default_factory=list)
    withheld: str | None = None
    assumed: Forecast | None = None
    """Faster than the recommendation as predicted, but under a strategy variant whose steps
    the noise-scale model does not cover (it is not synchronous SGD on the global batch)."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    """Predicted against measured, from --verify (and the pilot)."""


def ranked(forecasts: list[Forecast]) -> list[Forecast]:
    return sorted(forecasts, key=lambda f: (not f.feasible, f.time_s, f.device_hours,
                                            f.candidate.devices))


def withheld(basis: Basis, forecasts: list[Forecast]) -> str | None:
    """Why no configuration is recommended, or None: the noise scale carries the steps at
    every global batch but the reference's, so it must be precise (or given by hand)."""
    stats = basis.stats
    others = any(f.candidate.global_batch != stats.reference_batch for f in forecasts)
    if not others or stats.noise_given:
        return None
    if stats.noise is None:
        return ("no gradient noise scale: the steps at global batches other than the "
                f"reference {stats.reference_batch} cannot be predicted; give --noise-scale B")
    verdict = precision.judge(stats.noise, stats.noise_se, stats.noise_steps)
    if verdict.precise or not verdict.known:
        return None
    return (verdict.reason(f"the gradient noise scale ({stats.noise:,.4g} samples)")
            + "; the steps at other global batches rest on it, so nothing is recommended "
            "(measure longer: a later target or more --epochs, or give --noise-scale B)")


def decide(basis: Basis, forecasts: list[Forecast], rule: str, goal: str,
           space: dict[str, Any]) -> Advice:
    order = ranked(forecasts)
    advice = Advice(basis, order, rule, goal, space)
    feasible = [f for f in order if f.feasible]
    advice.withheld = withheld(basis, forecasts)
    if advice.withheld is None and not feasible:
        advice.withheld = "no configuration of the space is feasible: " + "; ".join(
            sorted({f.why_not or "" for f in order})[:3])
    if advice.withheld is not None:
        return advice
    exact = [f for f in feasible if f.candidate.variant.exact]
    best = exact[0] if exact else feasible[0]
    tied = [f for f in (exact or feasible) if f.time_s <= best.time_s * (1 + TIE)]
    best = min(tied, key=lambda f: (f.high_s, f.time_s))
    advice.recommended = best
    if exact and not feasible[0].candidate.variant.exact:
        advice.assumed = feasible[0]
    cheapest = min(feasible, key=lambda f: (f.device_hours, f.time_s))
    if cheapest is not best and cheapest.device_hours < best.device_hours * 0.999:
        advice.cheapest = cheapest
    advice.limits = limits(best, order, basis)
    return advice


def limits(best: Forecast, forecasts: list[Forecast], basis: Basis) -> list[str]:
    """What keeps the recommendation from being faster, in words: the link, contention, the
    critical batch, memory, the budget, or simply the devices there are."""
    c = best.candidate
    said: list[str] = []
    more = [f for f in forecasts if f.candidate.devices > c.devices]
    model = basis.model_of(c.variant)
    stats = basis.stats
    if not more:
        said.append(f"the devices: it uses all {c.devices}, at {best.efficiency:.0%} "
                    "efficiency; more would still shorten it")
    else:
        n = min(f.candidate.devices for f in more)
        at_n = [f for f in more if f.candidate.devices == n]
        fitting = [f for f in at_n if f.feasible]
        if not fitting:
            reasons = [f.why_not or "" for f in at_n]
            common = max(set(reasons), key=reasons.count)
            said.append(f"at {n} devices no configuration is feasible: it {common}"
                        + (f" (the noise scale is {stats.noise:,.0f} samples: a larger global "
                           "batch needs more samples than the budget holds)"
                           if stats.noise and "budget" in common else ""))
        else:
            said += _slower(best, min(fitting, key=lambda f: f.time_s), basis)
    if c.accumulate > 1 or c.variant.stage > 0:
        budget = basis.speed.memory.budget
        said.append(f"memory: a device holds {best.memory_bytes / 2**30:.3g} GiB of this "
                    "configuration" + (f" of its {budget / 2**30:.3g} GiB" if budget else "")
                    + (f", so it accumulates {c.accumulate} micro-batches" if c.accumulate > 1
                       else ""))
    del model
    return said


def _slower(best: Forecast, nxt: Forecast, basis: Basis) -> list[str]:
    """Why the fastest configuration on more devices is slower than the recommendation."""
    c, n, stats = best.candidate, nxt.candidate.devices, basis.stats
    model = basis.model_of(nxt.candidate.variant)
    said = []
    step = nxt.step
    if step is not None and step.step_s > 0 and step.exposed_s / step.step_s >= LINK_SHARE:
        link = model.link.name if model is not None else "the link"
        said.append(f"the link ({link}): at {n} devices the exchange adds "
                    f"{step.exposed_s / max(step.step_s - step.exposed_s, 1e-12):.0%} to each "
                    f"step ({step.exposed_s * 1e3:.3g} ms exposed)")
    k = model.contention.get(n, 1.0) if model is not None else 1.0
    if k >= CONTENTION:
        said.append(f"contention: {n} processes on this machine compute {k:.2f}x slower than "
                    "one (measured without exchange)")
    if stats.noise is not None and nxt.candidate.global_batch > stats.noise:
        b0, b1, bn = c.global_batch, nxt.candidate.global_batch, stats.noise
        extra = (1 + b1 / bn) / (1 + b0 / bn)
        said.append(f"the critical batch: the noise scale is {bn:,.0f} samples, so a global "
                    f"batch of {b1:,} needs {extra:.2f}x the samples of {b0:,} to reach the "
                    "goal")
    if not said:
        said.append(f"at {n} devices the best prediction is {nxt.time_s / best.time_s:.2f}x as "
                    "long (whole epochs and the evaluations weigh more than the step)")
    return said
