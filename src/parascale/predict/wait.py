"""The wait for the slowest of N devices, from the measured distribution of a step's work.

A synchronous exchange starts when the last device is ready, so each step pays, on average,
E[max of N devices' work] − E[work]. With the record's quantiles of the per-step work (step −
sync, ``steps.work.quantiles`` in docs/record.md) that expectation is taken from the measured
distribution itself: Q(u), the quantile function, is piecewise linear between the recorded
quantiles, and E[max of N] = ∫ Q(u) d(u^N), exact on each linear piece.

Chosen against the normal spread from p50 and p95 (the model's fallback for older records):
a busy machine preempts a worker now and then for several milliseconds, a long, skewed tail
that p95 − p50 reads as a narrow normal; the measured quantiles carry the tail as it was.
Beyond the steps measured (N above the sample count, where the recorded maximum is all that
is known of the tail), the wait grows as a normal's would from there, g(N)/g(M) at M samples:
the distribution measured says nothing about rarer steps, and a tail does not stop at the
largest one seen.
"""
from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist


def expected_max(n: int) -> float:
    """E[max of n standard normals], Blom's approximation (0 for n = 1)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def expected_max_of(quantiles: Sequence[float], n: int) -> float:
    """E[max of n independent draws] of the distribution whose quantiles at evenly spaced
    levels 0..1 are ``quantiles`` (linear between them); n = 1 gives its mean."""
    steps = len(quantiles) - 1
    total = 0.0
    for i in range(steps):
        a, b = i / steps, (i + 1) / steps
        qa, qb = quantiles[i], quantiles[i + 1]
        mass = b ** n - a ** n
        # ∫_a^b (u − a)·n·u^(n−1) du, for the rising part of the piece
        rise = n / (n + 1) * (b ** (n + 1) - a ** (n + 1)) - a * mass
        total += qa * mass + (qb - qa) / (b - a) * rise
    return total


def centred(quantiles: Sequence[float]) -> list[float]:
    """The quantiles less their distribution's mean: the shape, whatever the step's length."""
    mean = expected_max_of(quantiles, 1)
    return [q - mean for q in quantiles]


def wait(shape: Sequence[float], samples: int, n: int) -> float:
    """E[max of n] − mean for the centred quantiles ``shape`` measured over ``samples`` steps;
    beyond ``samples`` devices, scaled as a normal's E[max] (see the module's note)."""
    if n <= 1 or len(shape) < 2:
        return 0.0
    within = min(n, max(2, samples))
    found = max(0.0, expected_max_of(shape, within) - expected_max_of(shape, 1))
    return found if n == within else found * expected_max(n) / expected_max(within)
