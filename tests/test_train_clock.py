"""StepClock.restart keeps epochs apart: the rows of one epoch never leak into the next; the
step's phases are timed on the clock and, inside --profile's window, named ranges of the trace
(one object, StepPhases, drives both)."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch

from parascale.config import TrainConfig
from parascale.training.observe.measure import StepClock
from parascale.training.observe.phases import StepPhases
from parascale.training.observe.profiling import Profiler


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


def _phased_step(phases: StepPhases, step: int) -> None:
    phases.begin(step)
    for phase in (phases.data, phases.compute, phases.sync, phases.optimizer, phases.after):
        with phase:
            torch.ones(4).sum()
    phases.end(step)


def test_the_phases_time_every_step_and_trace_those_of_the_window(tmp_path, monkeypatch):
    monkeypatch.setenv("KINETO_LOG_LEVEL", "6")  # the profiler sets it otherwise
    world = SimpleNamespace(rank=0, size=1, device=torch.device("cpu"), is_main=True)
    profiler = Profiler(TrainConfig.of(profile="2:3", out=str(tmp_path)), world)
    asked: list[float] = []

    def compute_end() -> float:  # the strategy's word on when compute ended: taken as given
        asked.append(time.perf_counter())
        return asked[-1]

    clock = StepClock(torch.device("cpu"))
    phases = StepPhases(clock, profiler, compute_end)
    for step in range(1, 5):
        _phased_step(phases, step)
    profiler.close()
    clock.flush()
    assert len(clock.rows) == 4 and all(len(row) == 5 for row in clock.rows)
    assert len(asked) == 4  # asked once per step, as the compute phase ends
    trace = json.loads((tmp_path / "traces" / "rank-0.json").read_text())
    names = [event.get("name") for event in trace["traceEvents"]]
    assert {n for n in names if n.startswith("parascale.step ")} == {
        "parascale.step 2", "parascale.step 3"}
    # two steps traced: each phase a range per step, the step's after-work a second sync
    for name, count in (("data", 2), ("compute", 2), ("optimizer", 2), ("sync", 4)):
        assert names.count(f"parascale.{name}") == count, name

