"""The gradient noise scale (training/observe/noise.py): the estimator against a problem whose true
tr(Σ) and |G|² are known, and the measurement wired into real training.

Least squares with x ~ N(0, I_d), y = x·w* + ε, ε ~ N(0, σ²), at parameters w = w* + r: the
per-sample gradient is g = x(x·r − ε), so G = E[g] = r and (Isserlis)
E[g gᵀ] = |r|² I + 2 r rᵀ + σ² I, hence tr(Σ) = (d + 1)|r|² + dσ² and
B_simple = tr(Σ)/|G|² = d + 1 + dσ²/|r|².
"""
import pytest
import torch

from parascale import precision
from parascale.config import TrainConfig
from parascale.sync import Traits
from parascale.training.observe.noise import NoiseScale, _round, advice, estimate

D, SIGMA, R_NORM = 20, 1.0, 0.5
TRUE_TRACE = (D + 1) * R_NORM ** 2 + D * SIGMA ** 2
TRUE_GRAD_SQ = R_NORM ** 2
TRUE_NOISE = TRUE_TRACE / TRUE_GRAD_SQ  # 101
TOLERANCE = 0.10  # the stated tolerance: 10 % of the true value, and within 3 standard errors


def least_squares_steps(steps: int, ranks: int, batch: int, seed: int = 0):
    """What a data-parallel run measures: each rank's |g_i|² over its batch, and |mean g_i|²."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(D, generator=gen, dtype=torch.float64)
    r *= R_NORM / r.norm()
    x = torch.randn(steps, ranks, batch, D, generator=gen, dtype=torch.float64)
    eps = SIGMA * torch.randn(steps, ranks, batch, generator=gen, dtype=torch.float64)
    residual = x @ r - eps  # steps x ranks x batch
    g = (x * residual.unsqueeze(-1)).mean(dim=2)  # steps x ranks x D: per-rank mean gradients
    return g.square().sum(-1), g.mean(dim=1).square().sum(-1)


@pytest.mark.parametrize("ranks, batch", [(2, 16), (4, 32), (8, 8)])
def test_the_estimator_recovers_the_known_noise_scale_of_least_squares(ranks, batch):
    local_sq, global_sq = least_squares_steps(steps=2000, ranks=ranks, batch=batch)
    figures = estimate(local_sq, global_sq, small=batch, big=ranks * batch)
    assert figures["noise_steps"] == 2000
    assert figures["trace_sigma"] == pytest.approx(TRUE_TRACE, rel=TOLERANCE)
    assert figures["grad_sq"] == pytest.approx(TRUE_GRAD_SQ, rel=TOLERANCE)
    assert figures["noise_scale"] == pytest.approx(TRUE_NOISE, rel=TOLERANCE)
    assert abs(figures["noise_scale"] - TRUE_NOISE) < 3 * figures["noise_scale_se"]


def test_batches_drawn_without_replacement_from_a_small_training_set_are_corrected_for():
    """Training draws each step's batches from a permutation of n samples, as here: the
    population's own gradient and covariance are the truth, and without the finite-population
    correction B_simple would come out too high by a share of about B_simple/n (half, here)."""
    n, ranks, batch, steps = 120, 4, 16, 3000
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, D, generator=gen, dtype=torch.float64)
    y = x @ torch.randn(D, generator=gen, dtype=torch.float64) + \
        5 * torch.randn(n, generator=gen, dtype=torch.float64)
    per_sample = x * (x @ torch.zeros(D, dtype=torch.float64) - y).unsqueeze(-1)  # at w = 0
    mean = per_sample.mean(0)
    truth = float((per_sample - mean).square().sum(1).mean() / mean.square().sum())
    draws = torch.stack([torch.randperm(n, generator=gen)[:ranks * batch] for _ in range(steps)])
    g = per_sample[draws].reshape(steps, ranks, batch, D).mean(2)
    local_sq, global_sq = g.square().sum(-1), g.mean(1).square().sum(-1)
    corrected = estimate(local_sq, global_sq, batch, ranks * batch, population=n)
    assert corrected["noise_scale"] == pytest.approx(truth, rel=TOLERANCE)
    naive = estimate(local_sq, global_sq, batch, ranks * batch)["noise_scale"]
    assert naive > truth * (1 + 0.5 * truth / n)  # the bias the correction removes


def test_the_naive_ratio_of_one_batch_size_would_be_far_off():
    """Why two batch sizes: |g|² alone mixes noise into the signal (a test that can fail if
    the estimator ever degenerated into using one of them)."""
    local_sq, global_sq = least_squares_steps(steps=500, ranks=4, batch=16)
    naive = float(local_sq.mean())  # E|g|² = |G|² + tr(Σ)/b, nowhere near |G|²
    assert naive > 4 * TRUE_GRAD_SQ
    figures = estimate(local_sq, global_sq, small=16, big=64)
    assert figures["grad_sq"] == pytest.approx(TRUE_GRAD_SQ, rel=0.25)


@pytest.mark.parametrize("small_sq, big_sq, said", [
    ([9.0, 11.0], 1.0, "|G|² is not positive"),  # 16·1 − 8·10 < 0: noise swamps the mean
    ([1.0, 1.2], 1.3, "tr(Σ) is not positive"),  # the big batch's gradient is no smaller
])
def test_an_estimate_that_is_not_positive_gives_no_figure_and_says_why(small_sq, big_sq, said):
    figures = estimate(torch.tensor([small_sq]), torch.tensor([big_sq]), small=8, big=16)
    assert figures["noise_scale"] is None and figures["noise_scale_se"] is None
    assert said in figures["noise_note"]


def test_the_advice_names_the_batch_and_where_this_run_is():
    below = advice(1234.0, 256)
    assert below.startswith("batches beyond about 1,200 give diminishing returns")
    assert "global batch of 256 is below it" in below
    assert "is beyond it already" in advice(40.0, 64)
    assert [_round(v) for v in (0.4, 7.6, 36.4, 101.0, 98_765.0)] == [1, 8, 36, 100, 99_000]


class _World:
    def __init__(self, size):
        self.size, self.rank, self.device = size, 0, torch.device("cpu")


class _Plan:
    class derived:
        per_device_batch, global_batch = 32, 64


class _Strategy:
    traits = Traits()  # a strategy that declares nothing

    def __init__(self, refusal=None):
        self.refusal, self.watcher = refusal, None

    def noise_refusal(self):
        return self.refusal

    def watch_gradients(self, watcher):
        self.watcher = watcher


@pytest.mark.parametrize("cfg, size, strategy, scaler, reason", [
    (TrainConfig.of(noise_scale=False), 2, _Strategy(), None, "--no-noise-scale"),
    (TrainConfig(), 1, _Strategy(), None, "needs 2 or more workers"),
    (TrainConfig(), 2, _Strategy(), object(), "fp16's loss scale"),
    (TrainConfig(), 2, _Strategy("--sync x never forms it"), None, "--sync x never forms it"),
])
def test_a_run_that_cannot_measure_it_records_why(cfg, size, strategy, scaler, reason):
    noise = NoiseScale(cfg, _World(size), strategy, _Plan, scaler)
    assert not noise.measuring and reason in noise.reason and strategy.watcher is None
    assert noise.end_epoch(1) == {"noise_scale": None}
    summary = noise.summary()
    assert summary["measured"] is False and summary["noise_scale"] is None
    assert summary["advice"] is None and noise.line() is None


@pytest.mark.parametrize("figure, se, steps, advises", [
    (1.0, 4.0, 4, False),  # vgg16's four steps: "1 ± 4" advised on the batch
    (692.0, 326.0, 22, False),  # the demo's: a standard error of 47 %
    (36.0, 9.5, 400, False),  # many steps, still too loose
    (36.0, 6.0, 4, False),  # tight, but a handful of steps
    (36.0, 6.0, 40, True),
])
def test_advice_only_from_a_precise_figure(figure, se, steps, advises):
    """The closing line and the record's advice say how to scale only when the estimate can
    carry it; otherwise that it was not measured precisely enough, and about how many steps
    would make it so."""
    noise = NoiseScale(TrainConfig(), _World(2), _Strategy(), _Plan, None)
    noise.last = {"epoch": 1, "noise_scale": figure, "noise_scale_se": se, "noise_steps": steps}
    line, summary = noise.line(), noise.summary()
    assert summary["steps"] == steps and summary["advice"] in line
    assert ("diminishing returns" in line) is advises
    assert ("not measured precisely enough" in line) is not advises
    if not advises:
        needed = precision.judge(figure, se, steps).steps_needed
        assert f"about {needed:,} steps would make it so" in line and needed > steps


def test_the_strategies_say_which_can_measure_it():
    from parascale import sync
    from parascale.runtime.world import World

    def refusal(**options):
        cfg = TrainConfig.from_dict(options)
        return sync.build(cfg, World(0, 2, 0, torch.device("cpu"), "gloo", "local")
                          ).noise_refusal()

    assert refusal() is None and refusal(sync="reduce-broadcast") is None
    assert refusal(compression="fp16") is None
    assert "low-rank" in refusal(compression="powersgd")
    for name in ("parameter-server", "local-sgd", "sma", "none"):
        assert f"--sync {name} never forms" in refusal(sync=name), name


@pytest.mark.slow
def test_training_measures_it_the_same_under_both_averaging_strategies(train_run):
    """DDP's hook takes the local norm bucket by bucket, reduce-broadcast from its flat buffer:
    the same gradients, so the same figures (to rounding), and a record that says so."""
    run = dict(workers=2, global_batch=64, steps=12, lr=0.1, momentum=0.9, seed=3)
    figures = {}
    for name in ("allreduce", "reduce-broadcast"):
        record, _ = train_run(sync=name, **run)
        (epoch,) = record["epochs"]
        assert epoch["noise_steps"] == 12 and epoch["noise_scale"] > 0
        noise = record["noise"]
        assert noise["measured"] and noise["reason"] is None and noise["epoch"] == 1
        assert (noise["per_device_batch"], noise["global_batch"]) == (32, 64)
        assert noise["noise_scale"] == epoch["noise_scale"]
        # 12 steps are too few to advise from (precision.MIN_STEPS): the record says so
        assert noise["steps"] == 12 and "not measured precisely enough" in noise["advice"]
        figures[name] = [epoch[k] for k in ("noise_scale", "grad_sq", "trace_sigma")]
    assert figures["allreduce"] == pytest.approx(figures["reduce-broadcast"], rel=1e-4)

    alone, _ = train_run(workers=1, global_batch=64, steps=2)
    assert alone["epochs"][0]["noise_scale"] is None
    assert not alone["noise"]["measured"] and "2 or more workers" in alone["noise"]["reason"]
