"""When a measured figure is precise enough to advise from, and how many steps would make it so.

A statistical estimate (the gradient noise scale above all) is a figure plus a standard error
over some number of steps. Four steps of vgg16 gave "1 ± 4 samples" and were still turned into
advice about the batch; an estimate is only worth a recommendation when its standard error is a
small share of it and it rests on more than a handful of steps. The rule, in one place so that
training's closing line, ``report`` and ``predict`` say the same:

- precise enough: at least :data:`MIN_STEPS` steps, and a standard error of at most
  :data:`MAX_RELATIVE_ERROR` of the figure;
- otherwise the figure is still shown, but no advice is drawn from it; instead, roughly how
  many steps would make it precise. The standard error of a mean over steps falls like
  1/sqrt(steps), so steps' = steps·(relative error / :data:`MAX_RELATIVE_ERROR`)², and never
  fewer than :data:`MIN_STEPS`.

A figure whose standard error and steps are both unknown (an older record) cannot be judged:
:attr:`Verdict.known` is False, and callers may advise with that said. Nothing here imports
torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MAX_RELATIVE_ERROR = 0.25
MIN_STEPS = 20


@dataclass(frozen=True)
class Verdict:
    """How far a figure can be trusted: ``precise`` when advice may be drawn from it."""

    precise: bool
    known: bool
    """False when neither the standard error nor the steps are known: nothing could be judged."""
    relative_error: float | None
    steps: int | None
    steps_needed: int | None
    """About how many steps in all would make it precise (None: precise, or not computable)."""

    def reason(self, what: str = "the estimate") -> str:
        """Why no advice is drawn from it, and what would fix that ('' when precise)."""
        if self.precise:
            return ""
        parts = []
        if self.relative_error is not None:
            parts.append(f"standard error {_share(self.relative_error)} of it")
        elif self.steps is not None and self.steps >= MIN_STEPS:
            parts.append("no standard error could be estimated")
        if self.steps is not None:
            parts.append(f"{self.steps:,} step(s)")
        said = f" ({', '.join(parts)})" if parts else ""
        more = (f"; about {self.steps_needed:,} steps would make it so (the standard error falls "
                "like 1/sqrt(steps))") if self.steps_needed else ""
        return (f"{what} was not measured precisely enough to advise from{said}: that needs "
                f"{MIN_STEPS}+ steps and a standard error of at most "
                f"{MAX_RELATIVE_ERROR:.0%}{more}")


def _share(relative: float) -> str:
    """``relative`` as a percentage with as many decimals as it takes to differ from the limit
    it is compared with (0.2512 is "25.1%", not the "25%" it would fail against)."""
    for decimals in range(3):
        shown = f"{relative:.{decimals}%}"
        if relative == MAX_RELATIVE_ERROR or shown != f"{MAX_RELATIVE_ERROR:.{decimals}%}":
            return shown
    return f"over {MAX_RELATIVE_ERROR:.0%}" if relative > MAX_RELATIVE_ERROR else \
        f"under {MAX_RELATIVE_ERROR:.0%}"


def judge(value: float | None, se: float | None, steps: int | None) -> Verdict:
    """The verdict on a figure ``value`` with standard error ``se`` over ``steps`` steps (either
    may be None when unknown)."""
    if not _positive(value):
        return Verdict(False, True, None, steps, None)
    relative = se / value if _finite(se) and se >= 0 else None
    count = steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 \
        else None
    if relative is None and count is None:
        return Verdict(False, False, None, None, None)
    enough = count is None or count >= MIN_STEPS
    tight = relative is not None and relative <= MAX_RELATIVE_ERROR
    if relative is None and count is not None and count >= MIN_STEPS:
        return Verdict(False, True, None, count, None)  # enough steps, but no error to check
    if enough and tight:
        return Verdict(True, True, relative, count, None)
    return Verdict(False, True, relative, count, steps_needed(relative, count))


def steps_needed(relative_error: float | None, steps: int | None) -> int | None:
    """About how many steps in all bring ``relative_error`` (over ``steps``) down to the
    threshold, at least :data:`MIN_STEPS`; None when ``steps`` is unknown."""
    if steps is None:
        return None
    if relative_error is None or relative_error <= MAX_RELATIVE_ERROR:
        return max(MIN_STEPS, steps)
    # se ∝ 1/sqrt(steps): steps' = steps·(r/r_max)²; at least one step to scale from
    needed = max(steps, 1) * (relative_error / MAX_RELATIVE_ERROR) ** 2
    return max(MIN_STEPS, math.ceil(min(needed, 1e12)))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value) -> bool:
    return _finite(value) and value > 0
