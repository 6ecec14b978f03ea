"""The run's state and the trainer's hooks (issue 23): Progress saves and loads itself, the loss
tally is the running sum to the bit, a small split normalised once is the per-batch one to the
bit, strategies decide before training through ``resolve``, and the noise scale watches
gradients without a field on the strategy."""
from __future__ import annotations


import torch

from parascale import sync
from parascale.config import TrainConfig
from parascale.data import split as split_module
from parascale.data.split import TensorSplit
from parascale.runrecord import EpochEntry
from parascale.runtime.world import World
from parascale.sync.base import Resolved, Strategy
from parascale.sync.sma import SMA
from parascale.training.observe.measure import LossTally
from parascale.training.observe.noise import NoiseScale
from parascale.training.record.progress import Progress

CPU = torch.device("cpu")
TWO = World(rank=0, size=2, local_rank=0, device=CPU, backend="gloo", launcher="local")


def test_progress_goes_on_from_what_its_state_dict_kept():
    before = Progress(step=40, position={"step": 40, "epoch": 3, "done": 0},
                      epochs=[entry(1, 0.5), entry(2, 0.25)],
                      tta={"reached": False}, warm={1}, decided={"learners": 2},
                      resumed=[{"by": "resume", "step": 20}])
    saved = before.state_dict()
    assert set(saved) == {"epochs", "tta", "elapsed_s", "warm", "resumed", "decided"}
    after = Progress()
    after.load_state_dict(saved)
    assert (after.epochs, after.tta, after.warm, after.resumed, after.decided) == \
        (before.epochs, before.tta, before.warm, before.resumed, before.decided)
    assert after.elapsed_before == saved["elapsed_s"]
    after.epochs[0].train_loss = 9.0  # a copy: the saved state does not change with the run
    assert saved["epochs"][0]["train_loss"] == 0.5


def entry(epoch: int, train_loss: float) -> EpochEntry:
    return EpochEntry(epoch, epoch == 1, 8, False, 1.0, [1.0, 0.9], [0.8, 0.8], 256, 256.0,
                      train_loss, 0.1, 0.0, 0.0, None, metrics={"test_loss": train_loss})


def test_the_loss_tally_is_the_running_sum_to_the_bit():
    generator = torch.Generator().manual_seed(3)
    losses = torch.rand(500, generator=generator) * 7 + 1e-3
    samples = torch.randint(1, 64, (500,), generator=generator).tolist()
    start = torch.tensor(123.456789, dtype=torch.float64)
    running = start.clone()
    tally = LossTally(CPU, start)
    for i, (loss, n) in enumerate(zip(losses, samples)):
        running += loss.double() * n  # what the step did before
        tally.add(loss, n)
        if i == 250:  # a checkpoint in the middle asks for the sum so far
            assert tally.total().item() == running.item()
    assert tally.total().dtype == torch.float64
    assert tally.total().item() == running.item()


def test_a_small_split_normalised_once_gives_the_per_batch_values(monkeypatch):
    x = torch.randint(0, 256, (50, 3, 6, 6), dtype=torch.uint8)
    split = TensorSplit(x, torch.arange(50) % 4, (0.5, 0.4, 0.3), (0.2, 0.25, 0.5), scale=1 / 255)
    order = [torch.randperm(50)[:8] for _ in range(5)]
    once = list(split.batches(order, CPU, train=True))
    assert split._ready is not None
    monkeypatch.setattr(split_module, "NORMALISED_BYTES", 0)  # every batch on its own again
    each = list(TensorSplit(x, torch.arange(50) % 4, (0.5, 0.4, 0.3), (0.2, 0.25, 0.5),
                            scale=1 / 255).batches(order, CPU, train=True))
    for (a, ya), (b, yb) in zip(once, each):
        assert torch.equal(a, b) and torch.equal(ya, yb)


def test_a_strategy_decides_nothing_before_training_unless_it_says_so():
    cfg = TrainConfig()
    assert not Strategy.resolves_before_training(cfg)
    assert Strategy.resolve(cfg, TWO, None, lambda: None, None) == Resolved(cfg)
    assert sync.strategy_of(cfg).resolves_before_training(cfg) is False


def test_sma_keeps_a_resumed_runs_tuned_count_without_tuning_again():
    cfg = TrainConfig.of(sync="sma", sync_options={"learners": "auto"})
    assert SMA.resolves_before_training(cfg)
    assert not SMA.resolves_before_training(cfg.replace(sync_options={"learners": 3}))

    def never():
        raise AssertionError("a resumed run must not tune again")

    for progress in ({"decided": {"learners": 3}}, {"learners": 3}):  # and from before decided
        resolved = SMA.resolve(cfg, TWO, None, never, progress)
        assert resolved.cfg.strategy.sync_options["learners"] == 3 and resolved.seconds == 0.0
        assert resolved.decided == {"learners": 3}  # which the resumed run keeps
    fixed = cfg.replace(sync_options={"learners": 2})
    assert SMA.resolve(fixed, TWO, None, never, None).cfg is fixed
    sma = SMA(resolved.cfg, TWO)
    sma.adopt(Resolved(resolved.cfg, 1.5, [{"learners": 1, "gain": None}]))
    assert sma.tuning == [{"learners": 1, "gain": None}]


class _Plan:
    class derived:
        per_device_batch, global_batch = 4, 8


class _Averaging(Strategy):
    def noise_refusal(self):
        return None  # a strategy that forms the mean gradient


def test_the_noise_scale_watches_the_gradients_the_strategy_shows_it():
    model = torch.nn.Linear(3, 2)
    strategy = _Averaging(TrainConfig(), TWO)
    strategy.wrap(model)
    noise = NoiseScale(TrainConfig(), TWO, strategy, _Plan, None)
    assert noise.measuring and strategy.watcher is noise
    assert not any("sq" in name or "noise" in name for name in vars(strategy))
    model(torch.ones(1, 3)).sum().backward()
    whole = torch.cat([p.grad.flatten() for p in model.parameters()])
    for piece in whole.split(4):  # DDP shows it bucket by bucket
        noise.before_exchange(piece)
    noise.observe()
    (row,) = noise.rows
    assert torch.allclose(row[0], whole.double().square().sum())
