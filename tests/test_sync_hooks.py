"""What the launcher asks a strategy before any worker starts (``Strategy`` class methods), seen
through a throwaway strategy that answers differently from every built-in one. No processes:
the launcher's checks (``training.launch.preflight``) only."""
import pytest

from parascale import sync
from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.runtime.env import available_cores
from parascale.sync.base import Strategy
from parascale.training import preflight


class Flock(Strategy):
    name = "flock"

    @classmethod
    def helper_processes(cls, cfg: TrainConfig) -> int:
        return 3

    @classmethod
    def replicas_per_device(cls, cfg: TrainConfig) -> int:
        return 4


@pytest.fixture
def flock():
    sync.register(Flock)
    yield
    sync.unregister(Flock.name)


SMALL = dict(model="mlp", dataset="synthetic", synthetic_size=256, synthetic_shape=(1, 4, 4))


def test_a_device_takes_as_many_batches_as_the_strategy_has_replicas(flock):
    derived = preflight(TrainConfig.of(sync="flock", batch_size=8, workers=2, **SMALL), 2)
    assert (derived["per_device_batch"], derived["global_batch"]) == (32, 64)
    assert derived["steps_per_epoch"] == 256 // 64


def test_the_strategys_helper_processes_count_against_the_cores(flock):
    cores = available_cores()
    workers = 4 * cores - 2  # fits alone; with 3 helpers, one thread over the limit
    cfg = TrainConfig.of(sync="flock", batch_size=1, workers=workers, threads=1, **SMALL)
    with pytest.raises(UsageError, match=f"^{4 * cores + 1} CPU threads"):
        preflight(cfg, workers)
    preflight(cfg.replace(sync="allreduce"), workers)


def test_the_built_in_strategies_answer_as_before():
    sma = TrainConfig.from_dict(dict(sync="sma", learners=3))
    assert sync.strategy_of(sma).replicas_per_device(sma) == 3
    auto = TrainConfig.from_dict(dict(sync="sma", learners="auto"))
    assert sync.strategy_of(auto).resolves_before_training(auto)
    assert sync.strategy_of(auto).replicas_per_device(auto) == 1  # until it is decided
    ps = TrainConfig.from_dict(dict(sync="parameter-server", ps_servers=2))
    assert sync.strategy_of(ps).helper_processes(ps) == 2
    for cfg in (TrainConfig(), TrainConfig.from_dict(dict(sync="none", learners=4)),
                TrainConfig.of(sync="nope")):
        kind = sync.strategy_of(cfg)
        assert (kind.helper_processes(cfg), kind.replicas_per_device(cfg),
                kind.resolves_before_training(cfg)) == (0, 1, False)

