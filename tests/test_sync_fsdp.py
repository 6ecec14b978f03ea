"""FSDP (--sync fsdp): the foundation test at both stages, one worker, and what it refuses."""
import pytest
import torch
from conftest import STEPS, assert_same
from torch import nn

from parascale.config import TrainConfig
from parascale.errors import UsageError
from parascale.sync.fsdp import cannot_shard, units


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    from conftest import run_training

    return run_training(tmp_path_factory.mktemp("single") / "run", workers=1, global_batch=32,
                        **STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_two_workers_with_half_the_batch_end_with_one_workers_parameters(train_run, single,
                                                                         stage):
    record, state = train_run(workers=2, global_batch=32, sync="fsdp",
                              sync_options={"stage": stage}, **STEPS)
    options = record["derived"]["sync_options"]
    assert (options["stage"], options["sharded"]) == (stage, True)
    assert options["units"] > 1  # the model's layers are units of their own
    assert record["epochs"][-1]["test_accuracy"] is not None  # evaluated on the whole model
    assert_same(state, single[1])


@pytest.mark.slow
def test_accumulation_equals_one_worker(train_run, single):
    _, state = train_run(workers=2, global_batch=32, accumulate=2, sync="fsdp", **STEPS)
    assert_same(state, single[1])


@pytest.mark.slow
def test_one_worker_runs_unsharded_and_says_so(train_run, capfd):
    record, _ = train_run(workers=1, global_batch=32, sync="fsdp", **STEPS)
    assert record["derived"]["sync_options"]["sharded"] is False
    assert "nothing to shard" in capfd.readouterr().out


def test_bf16_on_cpu_workers_is_no_longer_refused():
    """Issue 32: FSDP's bf16 (MixedPrecisionPolicy) was refused on the CPU as needing a GPU; it
    trains on CPU workers (gloo gathers bf16 parameters), and the combination matrix holds it to
    one worker with the whole batch, within bf16's tolerance (test_matrix_processes.py)."""
    from parascale import sync

    cfg = TrainConfig.of(sync="fsdp", precision="bf16")
    sync.validate(cfg)
    assert cfg.strategy.precision == "bf16"


@pytest.mark.parametrize("options, message", [
    (dict(precision="fp16"), "use --precision bf16"),
    (dict(sync_options={"stage": 4}), "stage=4: FSDP shards at stage 2 or 3"),
    (dict(sync_options={"stage": 1}), "--sync-option stage must be at least 2"),
    # there is no --stage flag: the message names the option as it is given (issue 32, item 14)
    (dict(sync_options={"stage": "foo"}), "^--sync-option stage must be an integer, got 'foo'$"),
])
def test_refused_in_one_line(options, message):
    from parascale import sync

    with pytest.raises(UsageError, match=message):
        sync.validate(TrainConfig.of(sync="fsdp", **options))


@pytest.mark.parametrize("sync_name", ["allreduce", "zero", "local-sgd"])
@pytest.mark.parametrize("stage", [2, 3])
def test_a_stage_is_refused_for_a_strategy_without_stages(sync_name, stage):
    """Issue 32, item 14: stage=3, fsdp's default, was accepted (and recorded) for any strategy."""
    from parascale import sync

    cfg = TrainConfig.of(sync=sync_name, sync_options={"stage": stage})
    with pytest.raises(UsageError) as caught:
        sync.validate(cfg)
    assert str(caught.value) == \
        f"--sync-option stage={stage} belongs to --sync fsdp, not --sync {sync_name}"


def test_units_are_a_module_lists_items_else_the_children_with_parameters():
    blocks = nn.Sequential(nn.Embedding(4, 2), nn.ModuleList([nn.Linear(2, 2)] * 1 +
                                                            [nn.Linear(2, 2)]), nn.ReLU())
    assert units(blocks) == list(blocks[1])
    plain = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    assert units(plain) == [plain[0], plain[2]]


def test_a_model_fsdp_cannot_shard_is_named():
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).to(torch.float64))
    assert "mix dtypes" in cannot_shard(mixed)
    assert "no parameters" in cannot_shard(nn.ReLU())
    assert cannot_shard(nn.Linear(2, 2)) is None
