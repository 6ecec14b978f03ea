"""Crossbow's SMA: the central model's arithmetic by hand, its edge cases, the auto-tuner's rule,
and real gloo processes holding one central model."""
from __future__ import annotations

import pytest
import torch
from conftest import assert_same
from torch import nn

from parascale import data, models
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.runtime.world import World
from parascale.sync.sma import SMA
from parascale.sync.sma_tune import HillClimb
from parascale.training.loop.sampling import train_shard
from parascale.validation import validate

CPU = torch.device("cpu")
ONE = World(rank=0, size=1, local_rank=0, device=CPU, backend="gloo", launcher="local")


def strategy(model: nn.Module, lr: float, momentum: float = 0.0, **options):
    cfg = TrainConfig.from_dict(dict(sync="sma", **options))
    sma = SMA(cfg, ONE)
    net = sma.wrap(model)
    return sma, net, torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)


def train_step(sma, net, optimizer, x, y=None, step=1):
    """One step as the trainer takes it: mean loss over the device's rows, step, after_step."""
    out = net(x)
    loss = out.mean() if y is None else nn.functional.cross_entropy(out, y)
    loss.backward()
    sma.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    sma.after_step(step)


def test_central_model_and_corrections_match_a_hand_computation():
    """w = 1 on two learners; learner j's gradient is x_j (2 and 4), lr 0.1, no momentum;
    alpha 0.5, central momentum 0.5. By hand, from c_j = a(w_j_old - z), w_j -= c_j,
    d = sum c_j + mu d_prev, z += d:
      step 1: w_old = (1, 1), updated (0.8, 0.6); c = (0, 0); z = 1
      step 2: w_old = (0.8, 0.6), updated (0.6, 0.2); c = (-0.1, -0.2) -> w = (0.7, 0.4);
              d = -0.3; z = 0.7
      step 3: w_old = (0.7, 0.4), updated (0.5, 0.0); c = (0, -0.15) -> w = (0.5, 0.15);
              d = -0.15 + 0.5 x -0.3 = -0.3; z = 0.4"""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    sma, net, optimizer = strategy(model, lr=0.1, learners=2, sma_alpha=0.5, sma_momentum=0.5)
    x = torch.tensor([[2.0], [4.0]])  # one row per learner: the mean loss's gradient is x / 2
    expected = [((0.8, 0.6), 1.0), ((0.7, 0.4), 0.7), ((0.5, 0.15), 0.4)]
    for step, (learners, central) in enumerate(expected, start=1):
        train_step(sma, net, optimizer, x, step=step)
        torch.testing.assert_close(net.vectors().flatten(), torch.tensor(learners))
        torch.testing.assert_close(model.weight.flatten(), torch.tensor([central]))
    assert sma.measurements()["syncs"] == 3


def digits_batch(rows: int, seed: int = 0):
    bundle = data.build(TrainConfig.of(dataset="digits", image_size=12))
    idx = torch.randperm(len(bundle.train), generator=torch.Generator().manual_seed(seed))[:rows]
    return next(bundle.train.batches([idx], CPU, train=False)), bundle


def lenet(bundle, seed=0):
    torch.manual_seed(seed)
    return models.build("lenet", bundle.num_classes, bundle.input_shape)


def test_one_learner_with_full_pull_and_no_momentum_makes_z_its_weights_before_the_update():
    (x, y), bundle = digits_batch(16)
    model = lenet(bundle)
    sma, net, optimizer = strategy(model, lr=0.05, momentum=0.9, learners=1, sma_alpha=1.0,
                                   sma_momentum=0.0)
    for step in range(1, 4):
        before = net.vectors()[0].clone()
        train_step(sma, net, optimizer, x, y, step)
        torch.testing.assert_close(sma.z, before)


def test_several_learners_pulled_by_one_over_m_make_z_their_average():
    (x, y), bundle = digits_batch(3 * 8, seed=1)
    model = lenet(bundle)
    sma, net, optimizer = strategy(model, lr=0.05, momentum=0.9, learners=3, sma_alpha=1 / 3,
                                   sma_momentum=0.0)
    for step in range(1, 4):
        before = net.vectors().clone()
        train_step(sma, net, optimizer, x, y, step)
        torch.testing.assert_close(sma.z, before.mean(0))


def test_the_learners_are_reset_to_z_when_the_step_schedule_drops_the_rate():
    (x, y), bundle = digits_batch(2 * 8)
    sma, net, optimizer = strategy(lenet(bundle), lr=0.05, learners=2, lr_schedule="step",
                                   lr_milestones=(1,))
    train_step(sma, net, optimizer, x, y, 1)
    assert not torch.equal(net.vectors()[0], sma.z)
    for group in optimizer.param_groups:
        group["lr"] = 0.005  # the trainer's step schedule, at its milestone
    train_step(sma, net, optimizer, x, y, 2)
    assert all(torch.equal(v, sma.z) for v in net.vectors())
    assert sma.measurements()["resets"] == 1


def test_evaluation_and_the_saved_model_are_the_central_model():
    (x, y), bundle = digits_batch(2 * 8)
    model = lenet(bundle)
    sma, net, optimizer = strategy(model, lr=0.05, learners=2)
    train_step(sma, net, optimizer, x, y)
    assert sma.local_module() is model
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(flat, sma.z)


def test_distances_are_recorded_and_thinned_on_long_runs(monkeypatch):
    import parascale.sync.sma as sma_module

    monkeypatch.setattr(sma_module, "MAX_DISTANCES", 4)
    (x, y), bundle = digits_batch(2 * 8)
    sma, net, optimizer = strategy(lenet(bundle), lr=0.05, learners=2)
    for step in range(1, 12):
        train_step(sma, net, optimizer, x, y, step)
    found = sma.measurements()
    assert found["syncs"] == 11 and len(found["distance"]) <= 4
    assert [d["sync"] for d in found["distance"]] == \
        list(range(1, 12, found["distance_every"]))[:len(found["distance"])]
    assert all(d["max"] >= d["mean"] > 0 for d in found["distance"][1:])
    assert found["central_spread"] == 0


# --- the auto-tuner's rule ------------------------------------------------------------------------

def decisions(throughputs, threshold=0.1, limit=16):
    climb = HillClimb(threshold, limit)
    for value in throughputs:
        assert not climb.done
        climb.observe(value)
    assert climb.done
    return [d["decision"] for d in climb.decisions], climb.learners


def test_the_tuner_adds_while_throughput_grows_by_more_than_the_threshold_then_removes():
    assert decisions([100, 150, 180, 185]) == (["add", "add", "add", "remove"], 3)
    assert decisions([100, 105]) == (["add", "remove"], 1)
    assert decisions([100, 111, 121]) == (["add", "add", "remove"], 2)  # +11%, then +9%
    assert decisions([100, 150], limit=2) == (["add", "stop"], 2)
    assert decisions([100], limit=1) == (["stop"], 1)


def test_the_tuner_records_gains_against_the_count_before():
    climb = HillClimb(0.1)
    for value in (100, 150, 160):
        climb.observe(value)
    assert [d["gain"] for d in climb.decisions] == [None, 0.5, pytest.approx(1 / 15)]
    assert [d["learners"] for d in climb.decisions] == [1, 2, 3]


# --- input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, words", [
    (dict(learners=0), "--learners must be a positive integer or auto"),
    (dict(learners="many"), "--learners must be a positive integer or auto"),
    (dict(sma_alpha=0.0), "--sma-alpha is a fraction in (0, 1]"),
    (dict(sma_momentum=1.0), "--sma-momentum must be in [0, 1)"),
    (dict(global_batch=64), "not --global-batch"),
    (dict(lr_scaling="linear"), "leave out --lr-scaling"),
    (dict(accumulate=2), "leave out --accumulate"),
    (dict(tune_threshold=0.2), "belongs to --learners auto"),
])
def test_bad_sma_settings_are_one_line(options, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        validate(TrainConfig.from_dict(dict(sync="sma", **options)))


def test_sma_options_belong_to_sma():
    with pytest.raises(UsageError, match="--learners 2 belongs to --sync sma"):
        validate(TrainConfig.from_dict(dict(sync="allreduce", learners=2)))


def test_a_device_trains_one_batch_per_learner():
    from parascale import sync
    from parascale.batch import derive

    cfg = TrainConfig.from_dict(dict(sync="sma", learners=3, batch_size=16))
    derived = derive(cfg, 2, sync.strategy_of(cfg).replicas_per_device(cfg))
    assert (derived.per_device_batch, derived.global_batch) == (48, 96)


# --- real processes -------------------------------------------------------------------------------

OPTIONS = dict(model="mlp", dataset="digits", steps=4, lr=0.1, momentum=0.9, weight_decay=1e-4,
               seed=5, sync="sma", learners=2, sma_alpha=0.3, sma_momentum=0.5)
WORKERS, PER_LEARNER = 2, 8


def reference(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """Four plain replicas (2 devices x 2 learners), each with its own SGD, and the equations."""
    bundle = data.build(cfg)
    learners, alpha, momentum = (cfg.strategy.sync_options[k] for k in ("learners", "sma_alpha",
                                                                        "sma_momentum"))
    replicas = []
    for _ in range(WORKERS * learners):
        torch.manual_seed(cfg.job.seed)
        replicas.append(models.build(cfg.job.model, bundle.num_classes, bundle.input_shape))
    torch.manual_seed(cfg.job.seed)
    central = models.build(cfg.job.model, bundle.num_classes, bundle.input_shape)
    optimizers = [torch.optim.SGD(m.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum,
                                  weight_decay=cfg.optim.weight_decay) for m in replicas]
    batches = []
    for rank in range(WORKERS):
        shard = train_shard(len(bundle.train), PER_LEARNER * learners, WORKERS, rank, 1,
                            cfg.job.seed, 1, cfg.batch.steps)
        device = list(bundle.train.batches([s[0] for s in shard], "cpu", train=True))
        for j in range(learners):
            rows = slice(j * PER_LEARNER, (j + 1) * PER_LEARNER)
            batches.append([(x[rows], y[rows]) for x, y in device])

    def flat(m):
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    z, previous = flat(central), torch.zeros_like(flat(central))
    for step in range(cfg.batch.steps):
        old = []
        for model, optimizer, mine in zip(replicas, optimizers, batches):
            old.append(flat(model))
            x, y = mine[step]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        delta = torch.zeros_like(z)
        for model, w_old in zip(replicas, old):
            c = alpha * (w_old - z)
            torch.nn.utils.vector_to_parameters(flat(model) - c, model.parameters())
            delta += c
        delta += momentum * previous
        previous = delta
        z = z + delta
    torch.nn.utils.vector_to_parameters(z, central.parameters())
    return central.state_dict()


@pytest.mark.slow
def test_two_processes_of_two_learners_hold_the_central_model_of_the_equations(train_run):
    record, state = train_run(workers=WORKERS, batch_size=PER_LEARNER, **OPTIONS)
    assert record["status"] == "ok", record.get("reason")
    assert_same(state, reference(TrainConfig.from_dict(OPTIONS)))
    found = record["sync"]
    assert found["learners"] == 2 and found["syncs"] == 4
    assert found["central_spread"] == 0  # every process held the same z at every sync
    assert record["derived"]["per_device_batch"] == 16
    assert record["derived"]["sync_options"]["learners"] == 2


@pytest.mark.slow
def test_sma_trains_digits_and_auto_tunes_its_learners(train_run):
    record, _ = train_run(workers=2, model="smallcnn", dataset="digits", image_size=12,
                          batch_size=8, epochs=4, lr=0.05, sync="sma", learners="auto",
                          target_accuracy=0.9, stop_at_target=True)
    assert record["status"] == "ok", record.get("reason")
    assert record["time_to_accuracy"]["reached"]  # 90% within 4 epochs
    tuning = record["sync"]["tuning"]
    assert tuning and tuning[0]["decision"] in ("add", "stop")
    assert tuning[-1]["decision"] in ("remove", "stop")
    assert record["sync"]["learners"] == record["derived"]["sync_options"]["learners"] >= 1
    assert record["config"]["learners"] == "auto"
