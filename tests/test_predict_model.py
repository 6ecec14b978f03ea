"""The cost model's arithmetic: the α-β fit, each strategy's formula against a hand computation,
the step-time composition. Pure functions: no process, no file."""
from __future__ import annotations

import math

import pytest

from parascale.predict import costs
from parascale.predict.interconnect import Link, fit_comm, fit_rows, preset
from parascale.predict.model import Model, Work, expected_max, overlap_from

ALPHA, BETA = 50e-6, 1 / 2e9  # 50 us, 2 GB/s
LINK = Link("test", ALPHA, BETA, "assumed", "test figures")
S = 100e6  # bytes


def comm_record(n: int, alpha: float, beta: float, sizes=(1024, 65536, 1 << 20, 16 << 20),
                backend: str = "gloo") -> dict:
    rows = [{"op": "allreduce", "bytes": s, "time_s": 2 * (n - 1) * alpha
             + 2 * (n - 1) / n * s * beta} for s in sizes]
    return {"schema": "parascale.comm/1", "status": "ok", "world_size": n,
            "environment": {"backend": backend, "hosts": ["h"]}, "results": rows}


@pytest.mark.parametrize("n", [2, 4])
def test_fit_recovers_alpha_and_beta(n):
    link = fit_comm(comm_record(n, ALPHA, BETA))
    assert link.alpha_s == pytest.approx(ALPHA, rel=1e-6)
    assert link.beta_s_per_byte == pytest.approx(BETA, rel=1e-6)
    assert link.how == "measured" and link.fit["max_relative_residual"] < 1e-6
    assert link.correction(1 << 20) == pytest.approx(1.0)  # the line is exact: nothing to correct


def test_fit_takes_the_mean_iteration_where_the_record_has_it():
    # a busy machine's preempted iterations: the means twice the medians; a step pays the mean
    record = comm_record(2, ALPHA, BETA)
    for row in record["results"]:
        row["mean_s"] = 2 * row["time_s"]
    link = fit_comm(record)
    assert link.alpha_s == pytest.approx(2 * ALPHA, rel=1e-6)
    assert link.beta_s_per_byte == pytest.approx(2 * BETA, rel=1e-6)
    assert link.fit["statistic"] == "mean" and "mean iteration" in link.source
    # a record made before mean_s: the medians, as before
    older = fit_comm(comm_record(2, ALPHA, BETA))
    assert older.alpha_s == pytest.approx(ALPHA, rel=1e-6) and older.fit["statistic"] == "median"


def test_fit_never_negative_and_correction_follows_measurement():
    # times that fall with size below 64K would give a negative β; a steep top gives α < 0
    rows = [("allreduce", 2, 1024.0, 1e-3), ("allreduce", 2, 65536.0, 0.9e-3)]
    alpha, beta, _ = fit_rows(rows)
    assert alpha >= 0 and beta >= 0
    record = comm_record(2, ALPHA, BETA)
    record["results"][2]["time_s"] *= 2  # 1 MiB measured twice as slow as the line says
    link = fit_comm(record)
    measured = record["results"][2]["time_s"]
    assert link.correction(1 << 20) == pytest.approx(measured / link.predicted(2, 1 << 20))
    assert link.correction(1 << 20) > 1.5
    assert link.correction(1e12) == 1.0  # outside the measured sizes: the fit alone


def test_ring_tree_and_reduce_broadcast_by_hand():
    n = 8
    assert costs.ring(n, S, LINK) == pytest.approx(2 * 7 * ALPHA + 2 * 7 / 8 * S * BETA)
    assert costs.ring(n, S, LINK, messages=4) == pytest.approx(4 * 14 * ALPHA + 1.75 * S * BETA)
    assert costs.tree(n, S, LINK) == pytest.approx(2 * 3 * (ALPHA + S * BETA))
    assert costs.tree(5, S, LINK) == pytest.approx(2 * 3 * (ALPHA + S * BETA))  # ceil(log2 5)
    assert costs.reduce_broadcast(n, S, LINK) == pytest.approx(2 * 7 * (ALPHA + S * BETA))


def test_parameter_server_by_hand():
    # one server: the server is the bottleneck, n·S; with as many servers as workers, S
    assert costs.parameter_server(8, S, LINK, 1) == pytest.approx(2 * (ALPHA + 8 * S * BETA))
    assert costs.parameter_server(8, S, LINK, 4) == pytest.approx(2 * (ALPHA + 2 * S * BETA))
    assert costs.parameter_server(8, S, LINK, 16) == pytest.approx(2 * (ALPHA + S * BETA))


def test_local_sgd_is_amortised_over_its_period():
    every4 = costs.strategy("local-sgd", {"period": 4})
    assert costs.per_step(every4, 8, S, LINK) == pytest.approx(costs.ring(8, S, LINK) / 4)
    assert not every4.overlaps and costs.strategy("allreduce").overlaps


@pytest.mark.parametrize("name", costs.names())
def test_one_device_exchanges_nothing(name):
    strategy = costs.strategy(name, {"ps_servers": 2, "period": 2})
    model = Model(Work(1e-3, 0.0, 2e-3), S, strategy, LINK, 0.5)
    point = model.point("weak", 1, 32, 32)
    assert point.comm_s == 0 and point.exposed_s == 0
    assert point.speedup == pytest.approx(1.0) and point.efficiency == pytest.approx(1.0)


def test_hierarchical_is_flat_with_one_node_or_one_device_per_node():
    slow = preset("25gbe")
    for n in (2, 8):
        assert costs.hierarchical_ring(n, S, LINK, slow, per_node=8) == \
            pytest.approx(costs.ring(n, S, LINK))
        assert costs.hierarchical_ring(n, S, LINK, slow, per_node=1) == \
            pytest.approx(costs.ring(n, S, slow))
    # 4 nodes of 8: inside a node S over the fast link, across nodes S/8 over the slow one
    assert costs.hierarchical_ring(32, S, LINK, slow, per_node=8) == pytest.approx(
        costs.ring(8, S, LINK) + costs.ring(4, S / 8, slow))


def test_step_time_composition_with_overlap():
    work = Work(per_sample_s=1e-4, fixed_s=0.0, other_s=1e-3)  # compute(32) = 3.2 ms
    strategy = costs.strategy("allreduce")
    model = Model(work, 1e6, strategy, LINK, overlap=0.5)
    comm = costs.ring(4, 1e6, LINK)
    point = model.point("weak", 4, 32, 32)
    assert point.comm_s == pytest.approx(comm)
    assert point.exposed_s == pytest.approx(max(0.0, comm - 0.5 * 3.2e-3))
    assert point.step_s == pytest.approx(4.2e-3 + point.exposed_s)
    assert point.efficiency == pytest.approx(4.2e-3 / point.step_s)  # weak: t1/tN
    # hidden entirely when compute is long enough
    assert Model(work, 1e3, strategy, LINK, overlap=1.0).point("weak", 4, 32, 32).exposed_s == 0
    # a strategy that exchanges after backward hides nothing, whatever φ says
    after = Model(work, 1e6, costs.strategy("reduce-broadcast"), LINK, overlap=1.0)
    assert after.point("weak", 4, 32, 32).exposed_s == pytest.approx(
        costs.reduce_broadcast(4, 1e6, LINK))


def test_waiting_for_the_slowest_device_grows_with_n_and_shrinks_with_the_period():
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(0.564, abs=0.03)  # exact: 1/sqrt(pi)
    assert expected_max(8) == pytest.approx(1.424, abs=0.03)  # tables of normal order statistics
    work = Work(1e-4, 0.0, 0.0)
    sync = Model(work, 1.0, costs.strategy("allreduce"), LINK, 1.0, spread_s=1e-3)
    point = sync.point("weak", 8, 32, 32)
    assert point.wait_s == pytest.approx(1e-3 * expected_max(8))
    assert point.step_s == pytest.approx(3.2e-3 + point.wait_s + point.exposed_s)
    every4 = Model(work, 1.0, costs.strategy("local-sgd", {"period": 4}), LINK, 0.0, spread_s=1e-3)
    assert every4.wait(8) == pytest.approx(sync.wait(8) / 2)  # σ·√H over H steps


def test_strong_scaling_shrinks_the_batch_and_stops_below_one_sample():
    model = Model(Work(1e-4, 0.0, 0.0), 1e6, costs.strategy("allreduce"), LINK, 2 / 3)
    points = model.curve("strong", [1, 2, 64, 128], 64)
    assert [p.workers for p in points] == [1, 2, 64]
    assert [p.per_device_batch for p in points] == [64, 32, 1]
    p2 = points[1]
    assert p2.efficiency == pytest.approx(points[0].step_s / (2 * p2.step_s))  # t1/(N tN)


def test_noise_scale_gives_steps_and_time_to_accuracy():
    model = Model(Work(1e-4, 0.0, 0.0), 1.0, costs.strategy("allreduce"), LINK, 1.0,
                  noise_scale=320.0)
    p = model.point("weak", 10, 32, 32)  # global batch 320 = B_noise
    assert p.steps_factor == pytest.approx((1 + 1) / (1 + 10))
    assert p.tta_speedup == pytest.approx(p.speedup / (p.steps_factor * 10))
    assert model.point("strong", 10, 3.2, 32).steps_factor == pytest.approx(1.0)


def test_overlap_from_a_measured_run():
    assert overlap_from(1e-3, 3e-3, 4e-3) == pytest.approx(0.5)
    assert overlap_from(5e-3, 3e-3, 4e-3) == 0.0  # more exposed than modelled: nothing hid
    assert overlap_from(0.0, 1.0, 1e-3) == 1.0
    assert math.isclose(overlap_from(1e-3, 1e-3, 0.0), 0.0)
