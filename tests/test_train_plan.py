"""The step plan is made once, by the launcher from the data it checked, and handed to the
workers (``runtime.contract.PLAN``); a worker refuses a plan made for another world or data."""
import json
from types import SimpleNamespace

import pytest

from parascale.batch import Plan, make_plan
from parascale.config import TrainConfig
from parascale.training.loop import setup

CFG = TrainConfig.of(batch_size=10, steps=7, warmup_epochs=0.5)


def test_the_plan_travels_as_json_and_reads_back_the_same():
    plan = make_plan(CFG, 2, 105, 40, replicas=1)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def _worker(size: int, train: int, test: int):
    return SimpleNamespace(size=size), SimpleNamespace(train=range(train), test=range(test))


def test_a_worker_trains_on_the_plan_it_is_given():
    given = make_plan(CFG, 2, 105, 40, replicas=1)
    assert setup.plan_for(CFG, *_worker(2, 105, 40), given) is given
    assert setup.plan_for(CFG, *_worker(2, 105, 40), None) == given  # none given: its own


@pytest.mark.parametrize("size, train, test", [(3, 105, 40), (2, 104, 40), (2, 105, 41)])
def test_a_worker_refuses_a_plan_for_another_world_or_other_data(size, train, test):
    with pytest.raises(RuntimeError, match="the launcher planned for 2 worker"):
        setup.plan_for(CFG, *_worker(size, train, test), make_plan(CFG, 2, 105, 40, replicas=1))
