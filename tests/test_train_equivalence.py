"""The foundation: synchronous data parallelism on N workers equals one worker on the whole batch.

With a model without batch norm and a fixed data order, N workers with per-device batch B/N must
reach the same parameters as one worker with batch B, step for step. A control run without
gradient exchange shows the comparison can fail.
"""
import pytest

from conftest import STEPS, assert_same

pytestmark = pytest.mark.slow  # every test here starts worker processes


def max_difference(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    from conftest import run_training

    return run_training(tmp_path_factory.mktemp("single") / "run", workers=1, global_batch=32,
                        **STEPS)


@pytest.mark.parametrize("workers", [2, 4])
def test_n_workers_with_batch_b_over_n_equal_one_worker_with_batch_b(train_run, single, workers):
    record, state = train_run(workers=workers, global_batch=32, **STEPS)
    assert record["status"] == "ok"
    assert record["derived"]["per_device_batch"] == 32 // workers
    assert record["derived"]["global_batch"] == 32
    assert_same(state, single[1])


def test_two_workers_of_b_equal_one_worker_of_2b(train_run, single):
    record, state = train_run(workers=2, batch_size=16, **STEPS)  # weak-scaling spelling
    assert record["derived"]["global_batch"] == 32
    assert_same(state, single[1])


def test_accumulation_equals_the_whole_batch(train_run, single):
    record, state = train_run(workers=2, batch_size=8, accumulate=2, **STEPS)
    assert record["derived"]["global_batch"] == 32
    assert_same(state, single[1])


def test_without_gradient_exchange_the_replicas_differ(train_run, single):
    # the control: if this matched too, the tests above would prove nothing
    _, state = train_run(workers=2, global_batch=32, sync="none", **STEPS)
    assert max_difference(state, single[1]) > 1e-3
