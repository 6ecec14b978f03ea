"""Every synchronous strategy on N workers equals one worker on the gathered batch.

The golden-model test of test_train_equivalence.py (which covers allreduce), repeated for the
strategies that exchange by hand: reduce-broadcast, the sync parameter server with one and two
server processes, and local SGD averaging after every step. Momentum and weight decay are on,
so the servers' SGD and local SGD's parameter averaging are checked for the full update rule.
"""
import pytest
from conftest import STEPS, assert_same

pytestmark = pytest.mark.slow  # every test here starts worker processes

SYNCHRONOUS = {
    "reduce-broadcast": dict(sync="reduce-broadcast"),
    "ps-1-server": dict(sync="parameter-server"),
    "ps-2-servers": dict(sync="parameter-server", ps_servers=2),
    "local-sgd-H1": dict(sync="local-sgd", period=1),
}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    from conftest import run_training

    return run_training(tmp_path_factory.mktemp("single") / "run", workers=1, global_batch=32,
                        **STEPS)


# every strategy on 2 and 4 workers, except one server on 4 (two servers on 4 run the same code)
CASES = [(s, w) for s in SYNCHRONOUS for w in (2, 4) if (s, w) != ("ps-1-server", 4)]


@pytest.mark.parametrize("strategy, workers", CASES)
def test_synchronous_strategy_equals_one_worker_on_the_whole_batch(train_run, single, strategy,
                                                                   workers):
    record, state = train_run(workers=workers, global_batch=32, **SYNCHRONOUS[strategy], **STEPS)
    assert record["config"]["sync"] == SYNCHRONOUS[strategy]["sync"]
    assert record["derived"]["per_device_batch"] == 32 // workers
    assert_same(state, single[1])
