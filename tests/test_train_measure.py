"""The step clock and the record's ``steps`` section, on hand-made times (no processes)."""
from __future__ import annotations

import time

import pytest
import torch

from parascale.training.observe.measure import PHASES, StepClock, step_summary

CPU = torch.device("cpu")


def timed_step(clock: StepClock, data=0.0, compute=0.0, sync=0.0, optimizer=0.0, after=0.0):
    """One step whose phases last at least the given seconds (sleeps: the clock reads the time)."""
    clock.start()
    time.sleep(data)
    clock.mark()
    time.sleep(compute)
    clock.boundary()
    time.sleep(sync)
    clock.boundary()
    time.sleep(optimizer)
    clock.boundary()
    time.sleep(after)
    clock.stop()


def test_a_row_splits_the_step_into_its_phases_and_after_step_work_counts_as_sync():
    clock = StepClock(CPU)
    timed_step(clock, data=0.01, compute=0.02, optimizer=0.01, after=0.03)
    assert clock.rows == []  # steps become rows only when the epoch is flushed
    clock.flush()
    [(data, compute, sync, optimizer, step)] = clock.rows
    assert data >= 0.01 and compute >= 0.02 and optimizer >= 0.01
    assert sync >= 0.03  # no sync phase slept: only the after-step sleep can put it there
    assert step == pytest.approx(data + compute + sync + optimizer, abs=1e-12)


def test_a_boundary_at_an_earlier_moment_moves_the_time_after_it_to_the_next_phase():
    # DDP names the moment its last bucket was ready; what follows is exposed synchronisation
    clock = StepClock(CPU)
    clock.start()
    before_mark = time.perf_counter()
    clock.mark()
    ready = time.perf_counter()
    time.sleep(0.05)
    clock.boundary(at=ready)
    clock.boundary()
    clock.boundary()
    clock.stop()
    clock.flush()
    _, compute, sync, _, _ = clock.rows[0]
    # bounds from the moments themselves, not a share of the sleep: a loaded machine may
    # pause between any two lines
    assert compute <= ready - before_mark and sync >= 0.05


def test_flush_resolves_each_pending_step_once():
    clock = StepClock(CPU)
    timed_step(clock)
    timed_step(clock)
    clock.flush()
    clock.flush()
    assert len(clock.rows) == 2
    timed_step(clock)
    clock.flush()
    assert len(clock.rows) == 3


def test_step_summary_pools_every_rank_and_keeps_each_rank_apart():
    # rows are [data, compute, sync, optimizer, step]; step times 10, 20 on rank 0 and 30 on 1
    rank0 = [[1.0, 2.0, 3.0, 4.0, 10.0], [1.0, 2.0, 5.0, 4.0, 20.0]]
    rank1 = [[3.0, 2.0, 1.0, 4.0, 30.0]]
    summary = step_summary([rank0, rank1, []], excluded="epoch 1 (warm-up)")
    assert summary["count"] == 3 and summary["excluded"] == "epoch 1 (warm-up)"
    assert set(summary["phases"]) == {*PHASES, "step"}
    # numpy's linear percentile over 10, 20, 30: p50 at index 1 = 20; p95 at 1.9 = 20 + 0.9·10
    assert summary["phases"]["step"] == pytest.approx(
        {"p50": 20.0, "p95": 29.0, "max": 30.0, "mean": 20.0})
    assert summary["phases"]["sync"] == pytest.approx(
        {"p50": 3.0, "p95": 4.8, "max": 5.0, "mean": 3.0})  # over 3, 5, 1: p95 = 3 + 0.9·2
    assert summary["phases"]["data"]["max"] == 3.0
    # rank 0 alone: 10 and 20, p95 at index 0.95 = 10 + 0.95·10; a rank without steps has none
    assert summary["per_rank"] == [
        {"rank": 0, "steps": 2, "step_p50_s": 15.0, "step_p95_s": pytest.approx(19.5),
         "work_mean_s": 11.0},  # steps less sync: 7 and 15
        {"rank": 1, "steps": 1, "step_p50_s": 30.0, "step_p95_s": 30.0, "work_mean_s": 29.0},
        {"rank": 2, "steps": 0, "step_p50_s": None, "step_p95_s": None, "work_mean_s": None}]


def test_step_summary_of_no_steps_has_no_figures():
    summary = step_summary([[], []], excluded="none")
    assert summary["count"] == 0
    assert all(value is None for value in summary["phases"].values())


def test_step_summary_keeps_the_work_distribution_and_the_wait():
    # rows are [data, compute, sync, optimizer, step]; work = step − sync: rank 0 10 then 30,
    # rank 1 20 then 20; per step the slower is 20 then 30, so rank 0 waits 10 then 0, rank 1
    # 0 then 10: 5 on average
    rank0 = [[1.0, 5.0, 5.0, 4.0, 15.0], [1.0, 25.0, 0.0, 4.0, 30.0]]
    rank1 = [[1.0, 15.0, 0.0, 4.0, 20.0], [1.0, 15.0, 10.0, 4.0, 30.0]]
    work = step_summary([rank0, rank1], excluded="none")["work"]
    assert work["mean"] == 20.0 and work["std"] == pytest.approx((50.0) ** 0.5)
    assert work["wait_s"] == 5.0
    quantiles = work["quantiles"]
    assert len(quantiles) == 41 and quantiles == sorted(quantiles)
    assert (quantiles[0], quantiles[20], quantiles[-1]) == (10.0, 20.0, 30.0)
    # one rank waits for no one; ranks with different step counts are not compared step by step
    assert step_summary([rank0], excluded="none")["work"]["wait_s"] is None
    assert step_summary([rank0, rank1[:1]], excluded="none")["work"]["wait_s"] is None
    assert step_summary([[], []], excluded="none")["work"] is None
