"""Distributed evaluation counts every test sample once; the record says what it measured."""
import pytest
import torch

from parascale import data, models
from parascale.config import TrainConfig
from parascale.training.loop.sampling import eval_sample

pytestmark = pytest.mark.slow  # every test here starts worker processes


def local_accuracy(cfg: TrainConfig, state: dict,
                   index: torch.Tensor | None = None) -> tuple[float, int]:
    """Accuracy of the saved model over the test set's samples ``index`` (default: all of
    them), in this one process."""
    bundle = data.build(cfg)
    model = models.build(cfg.job.model, bundle.num_classes, bundle.input_shape)
    model.load_state_dict(state)
    model.eval()
    index = torch.arange(len(bundle.test)) if index is None else index
    correct = 0
    with torch.no_grad():
        for x, y in bundle.test.batches([index], torch.device("cpu"), train=False):
            correct += int((model(x).argmax(1) == y).sum())
    return correct / len(index), len(index)


def test_accuracy_over_uneven_shards_equals_single_process_accuracy(train_run):
    # synthetic_size 404 gives 101 test samples: shards of 33/34 on 3 workers
    options = dict(dataset="synthetic", synthetic_shape=(3, 8, 8), synthetic_size=404,
                   model="mlp", workers=3, batch_size=8, epochs=2, lr=0.05)
    record, state = train_run(**options)
    assert record["derived"]["test_samples"] == 101
    accuracy, count = local_accuracy(TrainConfig.of(**options), state)
    assert count == 101
    assert record["summary"]["final_test_accuracy"] == pytest.approx(accuracy, abs=1e-12)


def test_a_budget_evaluates_the_same_sample_every_epoch_each_sample_once(train_run):
    # 101 test samples; 2 batches of 2 x 8 = 32 of them, drawn by seed 5, shared by 2 workers
    options = dict(dataset="synthetic", synthetic_shape=(3, 8, 8), synthetic_size=404,
                   model="mlp", workers=2, batch_size=8, epochs=2, lr=0.05, seed=5,
                   eval_batches=2, target_accuracy=0.01)
    record, state = train_run(**options)
    covered = {"test": {"samples": 32, "of": 101, "seed": 5}}
    assert [e["evaluation"] for e in record["epochs"]] == [covered, covered]
    assert record["time_to_accuracy"]["sample"] == covered["test"]  # reached on that sample
    accuracy, count = local_accuracy(TrainConfig.of(**options), state, eval_sample(101, 32, 5))
    assert count == 32
    assert record["summary"]["final_test_accuracy"] == pytest.approx(accuracy, abs=1e-12)


def test_record_has_warmup_schedule_time_to_accuracy_and_phases(train_run):
    record, _ = train_run(workers=2, batch_size=16, epochs=4, lr=0.02, lr_scaling="linear",
                          warmup_epochs=2, target_accuracy=0.8)
    epochs = record["epochs"]
    assert record["derived"]["effective_lr"] == pytest.approx(0.04)  # base batch 16, global 32
    assert epochs[0]["warmup"] and not any(e["warmup"] for e in epochs[1:])
    # the rate climbs during the first two epochs and holds the effective rate after them
    assert epochs[0]["lr"] < epochs[1]["lr"] < 0.04
    assert epochs[2]["lr"] == epochs[3]["lr"] == pytest.approx(0.04)
    tta = record["time_to_accuracy"]
    first = next(e for e in epochs if e["test_accuracy"] >= 0.8)
    assert tta == {"target": 0.8, "reached": True, "split": "test", "epoch": first["epoch"],
                   "elapsed_s": first["elapsed_s"]}
    for e in epochs:
        assert e["samples"] == e["steps"] * 32
        assert e["throughput"] == pytest.approx(e["samples"] / max(e["wall_time_s_per_rank"]))
        # each rank's CPU time of the same steps, beside the wall time (issue 23)
        assert len(e["cpu_time_s_per_rank"]) == 2 and min(e["cpu_time_s_per_rank"]) > 0
    phases = record["steps"]["phases"]
    assert set(phases) == {"data", "compute", "sync", "optimizer", "step"}
    assert record["steps"]["count"] == 2 * sum(e["steps"] for e in epochs[1:])
    assert [r["rank"] for r in record["steps"]["per_rank"]] == [0, 1]
    # the work outside the exchange, for predict's wait: both ranks' steps, their quantiles
    # from the fastest to the slowest, and the wait measured from the same steps on each rank
    work = record["steps"]["work"]
    assert work["quantiles"] == sorted(work["quantiles"]) and len(work["quantiles"]) == 41
    assert work["quantiles"][0] <= work["mean"] <= work["quantiles"][-1]
    assert work["wait_s"] >= 0 and all(r["work_mean_s"] > 0 for r in record["steps"]["per_rank"])
    assert len(record["memory"]["peak_bytes_per_rank"]) == 2


def test_training_stops_at_the_target_when_asked(train_run):
    record, _ = train_run(workers=2, batch_size=16, epochs=5, target_accuracy=0.3,
                          stop_at_target=True)
    assert len(record["epochs"]) == record["time_to_accuracy"]["epoch"] < 5


@pytest.mark.parametrize("option", [dict(precision="bf16"), dict(compile=True)])
def test_options_that_change_how_the_step_runs_still_train(train_run, option):
    record, state = train_run(workers=2, batch_size=16, epochs=2, lr=0.05, **option)
    assert record["status"] == "ok" and record["summary"]["final_test_accuracy"] > 0.5
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state)
