"""``parascale advise``'s arithmetic, search and ranking, on figures stated by hand: the
noise-scale model of steps and samples (McCandlish et al. 2018), the learning-rate rules, the
time as parascale measures it (whole epochs, evaluations), the band, the step with
accumulation, the strategies searched from what they declare, and the recommendation."""
from __future__ import annotations

import dataclasses
import math

import pytest

from parascale import sync
from parascale.advise import rank, space
from parascale.advise.forecast import Basis, forecast, steps_band
from parascale.advise.model import (Memory, Speed, Statistics, combined, lr_for, step_time,
                                    time_to_goal, warmup_steps)
from parascale.predict import costs
from parascale.predict.interconnect import preset
from parascale.predict.memory import PerParameter
from parascale.predict.model import Model, Work


def stats(**kwargs) -> Statistics:
    base = dict(reference_batch=32, lr=0.1, noise=32.0, noise_se=4.0, noise_steps=100,
                steps=100.0)
    return Statistics(**{**base, **kwargs})


# -- the noise-scale model ---------------------------------------------------------------------

def test_steps_grow_with_the_batch_as_the_noise_scale_says():
    s = stats()
    # S(B) = S_ref (1 + Bn/B) / (1 + Bn/B_ref): 100 (1 + 0.5) / (1 + 1) at B = 64
    assert s.steps_at(64) == pytest.approx(75.0)
    assert s.steps_at(16) == pytest.approx(100 * 3 / 2)
    assert s.steps_at(32) == 100  # the reference needs no noise scale
    assert stats(noise=None).steps_at(32) == 100
    assert stats(noise=None).steps_at(64) is None  # other batches do
    # S_min = S_ref / (1 + Bn/B_ref): a huge batch needs S_min steps
    assert s.steps_at(10 ** 9) == pytest.approx(50.0, rel=1e-6)


def test_a_budget_in_samples_grows_with_the_batch_as_the_noise_scale_says():
    s = stats(steps=None, budget_samples=3200.0)
    # E(B) = E_ref (1 + B/Bn) / (1 + B_ref/Bn): 3200 x 3 / 2 samples at 64, in 64-sample steps
    assert s.steps_at(64) == pytest.approx(3200 * 1.5 / 64)
    assert s.steps_at(32) == pytest.approx(100.0)


def test_learning_rate_rules():
    s = stats()
    assert lr_for(64, s, "linear") == pytest.approx(0.2)
    assert lr_for(64, s, "sqrt") == pytest.approx(0.1 * math.sqrt(2))
    assert lr_for(64, s, "none") == pytest.approx(0.1)
    # McCandlish's eps_opt(B) = eps_max / (1 + Bn/B): (1 + 1) / (1 + 0.5) at B = 64
    assert lr_for(64, s, "bounded") == pytest.approx(0.1 * 2 / 1.5)
    # it levels off at eps_max = lr (1 + Bn/B_ref) where the linear rule would run away
    assert lr_for(10 ** 9, s, "bounded") == pytest.approx(0.2, rel=1e-6)
    assert lr_for(64, dataclasses.replace(s, optimizer="adamw"), "bounded") == \
        pytest.approx(0.1 * math.sqrt(2 / 1.5))
    assert lr_for(64, dataclasses.replace(s, noise=None), "bounded") == pytest.approx(0.2)


def test_warm_up_only_where_the_rate_grows_a_lot_and_the_job_brings_none():
    s = stats()
    assert warmup_steps(0.15, s, 1000) == 0
    assert warmup_steps(0.2, s, 1000) == 50  # 5 % of the steps (Goyal et al.)
    assert warmup_steps(0.2, dataclasses.replace(s, warmup_given=True), 1000) == 0


# -- time as parascale measures it ---------------------------------------------------------------

def test_time_to_a_target_is_whole_epochs_and_their_evaluations():
    s = stats(train_samples=1000, eval_s=0.5, eval_devices=2, first_epoch_s=0.1,
              cap_samples=3000.0)
    t = time_to_goal(s, devices=1, batch=10, step_s=0.01, steps=150)
    # 100 steps an epoch: the target at step 150 is seen at the end of epoch 2
    assert (t.epochs, t.steps, t.evaluations, t.reached) == (2, 200, 2, True)
    # 200 steps of 10 ms, two evaluations of 0.5 s on 2 devices = 1 s on one, the first epoch
    assert t.time_s == pytest.approx(2.0 + 2 * 1.0 + 0.1)
    far = time_to_goal(s, devices=1, batch=10, step_s=0.01, steps=350)
    assert far.epochs == 4 and not far.reached  # 4000 samples, over the 3000 of the budget
    every2 = time_to_goal(dataclasses.replace(s, eval_every=2), 1, 10, 0.01, 50)
    assert (every2.epochs, every2.evaluations) == (2, 1)  # seen at the next evaluation


def test_one_device_evaluates_in_the_time_measured_on_one_device():
    """A small evaluation is mostly fixed cost: where the probes measured it on one worker,
    one device takes that, not the pilot's 2 devices' time spread back onto one."""
    s = stats(train_samples=1000, eval_s=0.006, eval_devices=2, eval_alone_s=0.0045)
    alone = time_to_goal(s, devices=1, batch=10, step_s=0.01, steps=100)
    assert alone.time_s == pytest.approx(1.0 + 0.0045)
    two = time_to_goal(s, devices=2, batch=10, step_s=0.01, steps=100)
    assert two.time_s == pytest.approx(1.0 + 0.006)
    spread = time_to_goal(dataclasses.replace(s, eval_alone_s=None), 1, 10, 0.01, 100)
    assert spread.time_s == pytest.approx(1.0 + 0.012)  # without it: spread over N, assumed


def test_time_to_spend_a_budget_counts_its_steps_and_each_evaluation():
    s = stats(steps=None, budget_samples=1500.0, train_samples=1000, eval_s=1.0)
    t = time_to_goal(s, devices=1, batch=10, step_s=0.01, steps=150)
    assert (t.steps, t.epochs, t.evaluations) == (150, 2, 2)
    assert t.time_s == pytest.approx(1.5 + 2.0)


def test_the_band_adds_each_inputs_change_in_quadrature():
    low, high = combined(10.0, [(8.0, 13.0), (11.0, 9.0)])
    assert low == pytest.approx(10 * (1 - math.hypot(0.2, 0.1)))
    assert high == pytest.approx(10 * (1 + math.hypot(0.3, 0.1)))


def model(per_sample=1e-3, fixed=2e-3, other=1e-3, size=4e6, overlap=0.0) -> Model:
    return Model(Work(per_sample, fixed, other), size, costs.strategy("allreduce"),
                 preset("pcie"), overlap)


def test_an_accumulated_step_hides_the_exchange_behind_its_last_micro_batch_only():
    m = model(overlap=0.5)
    one = step_time(m, 4, 32, accumulate=1)
    four = step_time(m, 4, 32, accumulate=4)
    compute = 2e-3 + 32e-3
    ring = 2 * 3 * 10e-6 + 2 * 3 / 4 * 4e6 / 15.75e9  # pcie, one bucket
    assert one.comm_s == pytest.approx(ring)
    assert four.work_s == pytest.approx(4 * compute + 1e-3)
    assert four.exposed_s == pytest.approx(max(0.0, ring - 0.5 * compute))
    assert step_time(m, 1, 32).step_s == pytest.approx(compute + 1e-3)  # one device: alone


# -- one configuration's forecast ---------------------------------------------------------------

def basis(**kwargs) -> Basis:
    memory = Memory(1e6, PerParameter(4, 4, 4, "counted"), 1e3, budget=kwargs.pop("budget",
                                                                                  None))
    speed = Speed(model(), 4e6, memory, work_band=0.1, link_low=0.5, link_high=2.0)
    return Basis("test", speed, stats(train_samples=None, **kwargs))


def variant(name="allreduce", **changed) -> space.Variant:
    cls = sync.get(name)
    settings = cls.Settings.of(changed)
    label = " ".join([name, *(f"{k}={v}" for k, v in changed.items())])
    return space.Variant(name, tuple(changed.items()), True, 0,
                         cls.equivalence(settings) is not None, label, settings,
                         cls.pattern(settings))


def test_a_forecast_is_the_step_times_the_steps_with_a_band_around_it():
    b = basis(noise_se=None, steps_low=None)
    c = space.Candidate(2, 32, 1, variant(), "fp32")
    f = forecast(c, b, "bounded")
    step = step_time(b.model_of(c.variant), 2, 32).step_s
    assert f.timing.steps == pytest.approx(75.0)  # S(64), no warm-up (rate x 4/3)
    assert f.time_s == pytest.approx(75 * step)
    assert f.low_s < f.time_s < f.high_s
    assert f.throughput == pytest.approx(64 / step)
    assert f.feasible and f.fits


def test_a_configuration_that_does_not_fit_says_so():
    b = basis(budget=1e6)  # 1 MB: 12 bytes a parameter of a million do not fit
    f = forecast(space.Candidate(1, 32, 1, variant(), "fp32"), b, "bounded")
    assert not f.fits and "GiB per device" in f.why_not


def test_the_steps_band_spans_the_noise_scale_and_the_reference_steps():
    s = stats(steps_low=80.0, steps_high=120.0)
    low, central, high = steps_band(64, s)
    assert central == pytest.approx(75.0)
    assert low < 75 * 0.8 < 75 * 1.2 < high


# -- the space ---------------------------------------------------------------------------------

JOB = {"model": "mlp", "dataset": "digits"}


def test_every_strategy_that_exchanges_is_searched_with_its_declared_variations():
    notes: list[str] = []
    found = {v.label: v for v in space.variants(None, JOB, notes)}
    assert {"allreduce", "allreduce compression=fp16", "fsdp", "fsdp stage=2", "zero",
            "local-sgd period=8", "parameter-server ps_servers=2"} <= set(found)
    assert sync.BASELINE not in {v.name for v in found.values()}  # exchanges nothing
    assert found["fsdp stage=2"].stage == 2 and found["zero"].stage == 1
    assert found["allreduce"].exact and not found["allreduce compression=fp16"].exact
    assert not found["local-sgd period=8"].exact and found["local-sgd"].exact
    assert any("trains several replicas per device" in n for n in notes)  # sma


def test_a_strategy_the_job_cannot_use_is_left_out_with_its_reason():
    notes: list[str] = []
    found = space.variants(None, {**JOB, "optimizer": "adamw"}, notes)
    assert "parameter-server" not in {v.name for v in found}
    assert any(n.startswith("parameter-server") and "adamw" in n for n in notes)


def test_a_strategy_registered_by_its_user_is_searched_without_an_edit():
    from toy_strategy import Toy

    sync.register(Toy)
    try:
        found = space.variants(["toy"], JOB, [])
        # its option does not change the declared pattern: only its defaults are searched
        assert [v.label for v in found] == ["toy"] and found[0].exact
    finally:
        sync.unregister("toy")


def test_batches_devices_and_accumulation():
    assert space.batches(32, None, 10 ** 6) == [8, 16, 32, 64, 128, 256]
    assert space.batches(12, None, 40) == [2, 4, 12, 16, 32]
    assert space.batches(32, [16, 64, 9999], 1000) == [16, 64]
    assert space.device_counts(3, None, None) == [1, 2, 3]
    assert space.device_counts(None, 8, 8) == [1, 2, 4, 8, 16, 32, 64]
    assert space.device_counts(None, 6, 3) == [1, 2, 4, 6, 12, 18]
    v = variant()
    found = space.candidates([1, 2], [16, 32, 64], [v], ["fp32"],
                             lambda _v, n, _p: 32 if n == 1 else 64, 4, None)
    # one device: b up to 32 (memory), then 32 x 2 and x 4 accumulated; two: all, no accumulation
    assert [(c.devices, c.per_device_batch, c.accumulate) for c in found] == [
        (1, 16, 1), (1, 32, 1), (1, 32, 2), (1, 32, 4), (2, 16, 1), (2, 32, 1), (2, 64, 1)]
    crowded = dataclasses.replace(v, helpers=1)
    assert all(c.devices == 1 for c in space.candidates(
        [1, 2], [16], [crowded], ["fp32"], lambda *_: 16, 1, None, cores=2))


# -- the recommendation -------------------------------------------------------------------------

def test_the_recommendation_is_the_fastest_whose_steps_are_modelled():
    b = basis()
    b.wire["allreduce compression=fp16"] = 2e6  # half the bytes on the wire
    exact = forecast(space.Candidate(2, 32, 1, variant(), "fp32"), b, "bounded")
    approx = forecast(space.Candidate(2, 32, 1, variant(compression="fp16"), "fp32"), b,
                      "bounded")
    one = forecast(space.Candidate(1, 32, 1, variant(), "fp32"), b, "bounded")
    assert approx.time_s < exact.time_s
    advice = rank.decide(b, [one, approx, exact], "bounded", "goal", {})
    assert advice.recommended is exact and advice.assumed is approx
    assert advice.cheapest is one  # one device alone wastes nothing
    assert advice.limits


def test_of_configurations_as_fast_as_the_advice_can_tell_the_narrowest_band_wins():
    b = basis()
    one, two = (forecast(space.Candidate(n, 32, 1, variant(), "fp32"), b, "bounded")
                for n in (1, 2))
    fast = dataclasses.replace(two, expected_s=1.00, low_s=0.7, high_s=1.6)
    sure = dataclasses.replace(one, expected_s=1.04, low_s=0.9, high_s=1.2)  # within 5 %
    tie = rank.decide(b, [fast, sure], "bounded", "goal", {})
    assert tie.recommended is sure
    assert tie.assumed is None  # the faster one lost a tie, not for steps the model assumes
    slower = dataclasses.replace(sure, expected_s=1.06)  # beyond it: the fastest
    assert rank.decide(b, [fast, slower], "bounded", "goal", {}).recommended is fast


def test_an_imprecise_noise_scale_withholds_the_recommendation():
    b = basis(noise_se=16.0, noise_steps=100)  # 50 %
    fs = [forecast(space.Candidate(n, 32, 1, variant(), "fp32"), b, "bounded") for n in (1, 2)]
    advice = rank.decide(b, fs, "bounded", "goal", {})
    assert advice.recommended is None
    assert "not measured precisely enough" in advice.withheld
    given = basis(noise_se=None, noise_steps=None, noise_given=True)
    fs = [forecast(space.Candidate(n, 32, 1, variant(), "fp32"), given, "bounded")
          for n in (1, 2)]
    assert rank.decide(given, fs, "bounded", "goal", {}).recommended is not None


def test_an_evaluation_spreads_over_the_devices_and_slows_with_contention():
    s = stats(train_samples=1000, eval_s=1.0, eval_devices=2, contention={2: 1.5})
    one = time_to_goal(s, devices=1, batch=10, step_s=0.0, steps=100)
    two = time_to_goal(s, devices=2, batch=10, step_s=0.0, steps=100)
    assert two.time_s == pytest.approx(1.0)  # as measured, on the pilot's 2 devices
    assert one.time_s == pytest.approx(2 / 1.5)  # all of it on one, without the contention


def test_a_busy_machines_probes_keep_the_measured_rest_of_the_step():
    """The probes' other cores are said beside the fit; they are not the step's other work."""
    from pathlib import Path

    from parascale.advise.readings import fit_compute
    from parascale.report.load import RunRecord
    from test_predict_cli import run_record

    probes = []
    for batch in (16, 32):
        data = run_record(1, compute=1e-3 * batch / 16, batch=batch, device="cpu")
        data["machine"] = {"busy": True, "other_cores": 1.4}
        probes.append(RunRecord(Path(f"b{batch}.json"), "probes", data))
    work, shown = fit_compute(probes, other=3e-4)
    assert work.other_s == 3e-4
    assert work.per_sample_s == pytest.approx(1e-3 / 16) and "1.40 cores" in shown.source


def test_the_first_epochs_extra_and_one_devices_evaluation_come_from_every_run_here():
    """The pilot runs first, on a cold machine; its first epoch's extra is not every run's."""
    from pathlib import Path

    from parascale.advise.options import Options
    from parascale.advise.readings import statistics
    from parascale.report.load import RunRecord

    def run(workers: int, extra: float, evaluation: float) -> RunRecord:
        # one epoch of 10 steps of 1 ms, its extra, then its evaluation
        wall = 10 * 1e-3 + extra
        return RunRecord(Path(f"r{workers}-{extra}.json"), "here", {
            "config": {"workers": workers}, "derived": {"world_size": workers},
            "steps": {"phases": {"step": {"mean": 1e-3}}},
            "epochs": [{"steps": 10, "wall_time_s": wall, "elapsed_s": wall + evaluation}]})

    pilot = run(2, 0.1, 0.004)
    probes = [run(1, 0.004, 0.005), run(1, 0.003, 0.006), run(1, 0.005, 0.005)]
    opts = Options(job={}, workers=2, noise_scale=100.0, steps_to_target=50)
    flat = {"lr": 0.1, "batch_size": 32, "target_metric": "loss", "target_value": 1.0}
    stats = statistics(flat, opts, pilot, [], 1.0, False, probes)
    assert stats.first_epoch_s == pytest.approx(0.0045)  # the median of the four runs'
    assert (stats.eval_s, stats.eval_devices) == (pytest.approx(0.004), 2)
    assert stats.eval_alone_s == pytest.approx(0.005)
    alone = statistics(flat, opts, pilot, [], 1.0, False)
    assert alone.first_epoch_s == pytest.approx(0.1) and alone.eval_alone_s is None
