"""The GPT on the Shakespeare corpus, trained by real workers: data parallelism is exact on a
token model, and a run reports tokens/s, loss, perplexity, FLOPs per step and utilisation."""
import json
import math

import pytest
from conftest import assert_same

from parascale.cli.main import main

pytestmark = pytest.mark.slow  # every test here starts worker processes

# the recipe's optimizer and schedule (AdamW, clipping, a warm-up from 0, a cosine floor), so
# that each of them must reproduce one worker too; clipped at a norm the gradients exceed
SMALL = dict(model="gpt", dataset="shakespeare", context=16, gpt_layers=2, gpt_heads=2,
             gpt_width=32, steps=5, lr=0.01, optimizer="adamw", adam_beta2=0.99,
             weight_decay=0.1, clip_grad_norm=0.5, warmup_steps=2, lr_schedule="cosine",
             lr_min=1e-3, seed=3, noise_scale=False, evaluate_test=False, val_fraction=0.01,
             eval_batches=20)
# (evaluated on 20 batches of 1% of the training windows: the whole held-out tenth of the
# corpus would take most of each run's time here; the command-line test below samples it)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    from conftest import run_training

    return run_training(tmp_path_factory.mktemp("single") / "run", workers=1, global_batch=8,
                        **SMALL)


def test_two_workers_with_half_the_batch_equal_one_worker_on_the_gpt(train_run, single):
    record, state = train_run(workers=2, global_batch=8, **SMALL)
    assert record["derived"]["per_device_batch"] == 4
    assert_same(state, single[1])
    # the same sample of the validation split, every window of it evaluated once over the ranks
    ours, theirs = record["epochs"][-1], single[0]["epochs"][-1]
    assert ours["evaluation"] == theirs["evaluation"]
    assert ours["evaluation"]["val"]["samples"] == 20 * 8 < ours["evaluation"]["val"]["of"]
    assert ours["evaluation"]["val"]["seed"] == 3
    assert ours["val_loss"] == pytest.approx(theirs["val_loss"], abs=1e-5)
    # the control: without the exchange the replicas drift apart, so the test above can fail
    _, alone = train_run(workers=2, global_batch=8, sync="none", **SMALL)
    assert max(float((alone[k] - single[1][k]).abs().max()) for k in alone) > 1e-3


def test_the_record_counts_tokens_perplexity_and_flops(single):
    record = single[0]
    summary, counted = record["summary"], record["flops"]
    assert record["derived"]["tokens_per_sample"] == 16
    assert summary["steady_tokens_per_s"] == pytest.approx(summary["steady_throughput"] * 16)
    last = record["epochs"][-1]
    assert last["val_perplexity"] == pytest.approx(math.exp(last["val_loss"]))
    assert counted["counted_by"] == "torch.utils.flop_counter.FlopCounterMode"
    assert counted["flops_per_step"] == summary["flops_per_step"] > 0
    assert counted["peak_measured"] and 0 < summary["mfu"] < 1
    assert summary["achieved_flops"] == pytest.approx(
        counted["flops_per_step"] * summary["steady_throughput"] / 8)


def test_the_command_line_reports_the_language_model(tmp_path, capfd):
    # in this process, whose fork server is warm; what it and rank 0 print, at the descriptors
    code = main(["train", "--model", "gpt", "--dataset", "shakespeare", "--workers", "2",
                 "--context", "16", "--gpt-layers", "2", "--gpt-width", "32", "--steps", "6",
                 "--batch-size", "4", "--peak-tflops", "0.5", "--out", str(tmp_path / "run")])
    out = capfd.readouterr()
    assert code == 0, out.err
    # 59,763 held-out windows of 16 tokens: evaluated on 200 global batches of 8 by default
    assert "59763 test samples (each evaluation: 1600 of them, drawn by --seed 0; " \
        "--eval-batches 0 for all)" in out.out
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["epochs"][-1]["evaluation"] == {
        "test": {"samples": 1_600, "of": 59_763, "seed": 0}}
    assert "evaluating test" not in out.out + out.err  # no bar off a terminal
    assert "tokens/s, train loss" in out.out  # the epoch line
    assert "nats/token, perplexity" in out.out
    assert "per step (torch's FLOP counter)" in out.out
    assert "of the devices' peak (1 TFLOP/s)" in out.out  # 2 x --peak-tflops 0.5
