"""The run record as types (parascale/runrecord.py): entries read back as the record wrote them,
the summary derived from the epochs, per-token figures from the task's unit alone."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from parascale import record as rec
from parascale import runrecord
from parascale.runrecord import EpochEntry, Unit

RECORDS = Path(__file__).resolve().parent / "records"
TYPED = [p for p in sorted(RECORDS.glob("*.json")) if json.loads(p.read_text()).get("task")]


@pytest.mark.parametrize("path", TYPED, ids=lambda p: p.name)
def test_an_entry_of_a_record_reads_back_key_for_key(path):
    data = json.loads(path.read_text())
    unit = Unit.of(data["task"])
    for written in data["epochs"]:
        again = EpochEntry.from_dict(written, unit).to_dict()
        assert {k: again[k] for k in written} == written  # older ones lack newer figures
        if "260a6d7" in path.name:  # the writer before types: the same keys, in its order
            assert list(again) == list(written)


def entry(epoch: int, **metrics: float | None) -> EpochEntry:
    return EpochEntry(epoch, epoch == 1, 10, False, 2.0, [2.0], [1.9], 320, 160.0, 1.5, 0.1,
                      0.0, 0.0, None, metrics=dict(metrics), elapsed_s=2.0 * epoch)


def finished(task: dict, epochs: list[EpochEntry], flops: dict | None = None) -> dict:
    return runrecord.finished(
        config={"model": "m", "dataset": "digits", "workers": 1}, derived={"world_size": 1},
        task=task, environment={}, epochs=epochs, steps={}, memory={}, time_to_accuracy=None,
        sync=None, machine=None, timing=None, continuity={"restarts": []}, flops=flops,
        summary=runrecord.RunSummary(0.5, 6.0, {"steady_throughput": 160.0})).to_dict()


def section(unit: Unit) -> dict:
    return runrecord.task_section("t", unit, {"loss": False, "accuracy": True}, "accuracy")


def test_per_token_figures_come_from_the_tasks_unit_not_the_dataset():
    tokens = finished(section(Unit("tokens", 8.0)), [entry(1, test_loss=2.0)])
    assert tokens["derived"]["tokens_per_sample"] == 8  # an integer when it is one
    assert tokens["epochs"][0]["tokens_per_s"] == 160.0 * 8
    assert tokens["epochs"][0]["test_perplexity"] == math.exp(2.0)
    assert tokens["summary"]["steady_tokens_per_s"] == 160.0 * 8
    assert tokens["summary"]["final_test_perplexity"] == math.exp(2.0)
    samples = finished(section(runrecord.SAMPLES), [entry(1, test_loss=2.0)])
    assert "tokens_per_sample" not in samples["derived"]
    assert not {"tokens_per_s", "test_perplexity"} & set(samples["epochs"][0])
    assert not {"steady_tokens_per_s", "final_test_perplexity"} & set(samples["summary"])


def test_the_summary_holds_the_last_evaluation_whatever_it_logged():
    record = finished(section(runrecord.SAMPLES),
                      [entry(1, test_loss=1.0, test_accuracy=0.5), entry(2, test_accuracy=0.7),
                       entry(3)])
    summary = record["summary"]
    # epoch 2 has no loss (a script may log accuracy alone): it is still the last evaluation
    assert summary["final_test_accuracy"] == 0.7 and summary["final_test_loss"] is None
    assert summary["final_metrics"] == {"test_accuracy": 0.7}
    assert summary["final_train_loss"] == 1.5 and "final_val_accuracy" not in summary
    assert "mfu" not in summary  # no FLOPs counted: none of their figures
    counted = finished(section(runrecord.SAMPLES), [entry(1, val_accuracy=0.9)],
                       flops={"flops_per_step": 10, "achieved_flops": 20.0, "mfu": 0.1})
    assert counted["summary"]["final_val_accuracy"] == 0.9
    assert (counted["summary"]["flops_per_step"], counted["summary"]["mfu"]) == (10, 0.1)


def test_a_failed_run_claims_no_figures_and_says_why(tmp_path):
    record = runrecord.failed({"workers": 2}, "oom", "out of memory", None, detail="trace",
                              restarts=[{"attempt": 1}], script={"path": "a.py", "args": []})
    written = record.to_dict()
    assert list(written) == ["schema", "status", "reason", "detail", "config", "derived",
                             "environment", "epochs", "steps", "memory", "time_to_accuracy",
                             "sync", "machine", "timing", "resumed", "restarts", "checkpoints",
                             "profile", "noise", "summary", "study", "script"]
    assert (written["summary"], written["epochs"], written["restarts"]) == \
        (None, [], [{"attempt": 1}])
    assert rec.read_record(rec.write(tmp_path, written))["status"] == "oom"


def test_the_launcher_adds_the_users_out_its_timing_and_its_restarts():
    worker = finished(section(runrecord.SAMPLES), [entry(1)])
    worker["config"]["out"] = "/tmp/staging"
    worker["timing"] = {"training_s": 2.0, "first_step_at": time.time() - 3.0}
    done = runrecord.launched(worker, out="runs/a", since=("process start", time.time() - 5.0),
                              restarts=[])
    assert done["config"]["out"] == "runs/a" and worker["config"]["out"] == "/tmp/staging"
    timing = done["timing"]
    assert timing["since"] == "process start" and timing["training_s"] == 2.0
    assert timing["startup_s"] == pytest.approx(2.0, abs=0.5)
    assert timing["finish_s"] == pytest.approx(timing["command_s"] - timing["startup_s"] - 2.0)
    assert list(done) == list(worker)  # the record's order kept
