"""The wait for the slowest of N devices, from the record's measured per-step work: the
quantile arithmetic by hand, and predict on a hand-made record whose steps are mostly even with
a few long preemptions (a busy machine), where p50/p95's normal reads the tail wrong."""
from __future__ import annotations

import itertools

import pytest
from test_predict_cli import OPTIMIZER, run_record

from conftest import write_study
from parascale.predict import Options, predict, wait
from parascale.predict.model import expected_max
from parascale.training.observe.measure import step_summary


def test_expected_max_of_a_uniform_distribution_by_hand():
    uniform = [i / 20 for i in range(21)]  # U(0, 1): E[max of n] = n / (n + 1)
    for n in (1, 2, 4, 64):
        assert wait.expected_max_of(uniform, n) == pytest.approx(n / (n + 1))
    shape = wait.centred(uniform)
    assert wait.wait(shape, 1000, 2) == pytest.approx(2 / 3 - 1 / 2)
    # beyond the 10 steps measured, grown as a normal's E[max] from N = 10
    assert wait.wait(shape, 10, 40) == pytest.approx(
        (10 / 11 - 1 / 2) * expected_max(40) / expected_max(10))
    assert wait.wait(shape, 10, 1) == 0.0


def preempted_steps(count: int = 100, every: int = 33, extra: float = 0.04) -> list[float]:
    """Steps of 20-21 ms, and every ``every``-th one preempted for ``extra`` seconds."""
    return [0.020 + 0.001 * (i % 10) / 10 + (extra if i % every == 0 else 0.0)
            for i in range(count)]


def test_predict_waits_for_the_slowest_as_the_work_was_measured(tmp_path):
    steps = preempted_steps()
    rows = [[0.0, t - OPTIMIZER, 0.0, OPTIMIZER, t] for t in steps]
    summary = step_summary([rows], excluded="epoch 1 (warm-up)")
    record = run_record(1, compute=sum(steps) / len(steps) - OPTIMIZER)
    record["steps"].update(count=summary["count"], work=summary["work"])
    record["steps"]["phases"]["step"] = summary["phases"]["step"]
    # by hand: two devices drawing steps independently from those measured
    mean = sum(steps) / len(steps)
    slowest = sum(max(a, b) for a, b in itertools.product(steps, steps)) / len(steps) ** 2
    opts = Options([str(write_study(tmp_path / "new", [record]))], interconnect="pcie",
                   workers=(1, 2), params=1e3, scaling="weak")
    got = predict(opts).curves["weak"][1].wait_s
    assert got == pytest.approx(slowest - mean, rel=0.15)
    # the older term: a normal of σ = (p95 − p50) / 1.645, blind to a 3 % tail (7x too short)
    phases = summary["phases"]["step"]
    before = (phases["p95"] - phases["p50"]) / 1.645 * expected_max(2)
    assert before < (slowest - mean) / 2
    # a record made before steps.work still predicts, with that older term
    del record["steps"]["work"]
    opts.sources = [str(write_study(tmp_path / "old", [record]))]
    assert predict(opts).curves["weak"][1].wait_s == pytest.approx(before)


def test_work_quantiles_that_do_not_ascend_are_refused(tmp_path):
    record = run_record(1)
    record["steps"]["work"] = {"quantiles": [0.02, 0.01, 0.03]}
    opts = Options([str(write_study(tmp_path / "s", [record]))], interconnect="pcie",
                   workers=(1, 2), params=1e3)
    with pytest.raises(Exception, match="steps.work.quantiles do not ascend"):
        predict(opts)
