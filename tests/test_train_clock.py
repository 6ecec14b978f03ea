"""StepClock.restart keeps epochs apart: the rows of one epoch never leak into the next."""
from __future__ import annotations

import torch

from parascale.training.observe.measure import StepClock


def _step(clock: StepClock) -> None:
    clock.start()
    clock.mark()
    for _ in range(3):  # compute, sync, optimizer; stop() ends the last phase
        clock.boundary()
    clock.stop()


def test_restart_hands_over_the_rows_and_starts_empty():
    clock = StepClock(torch.device("cpu"))
    _step(clock)
    _step(clock)
    clock.flush()
    first = clock.restart()
    assert len(first) == 2 and all(len(row) == 5 for row in first)
    assert clock.rows == [] and clock.restart() == []
    _step(clock)  # a step left pending at restart belongs to no epoch
    clock.restart()
    clock.flush()
    assert clock.rows == [] and len(first) == 2
