"""--eval-batches: an evaluation bounded by a fixed, seeded sample of the split, the same on any
number of ranks and at every evaluation, said in the record, and announced when it is long."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch

from parascale.cli.main import main
from parascale.config import EvaluationConfig, TrainConfig
from parascale.runrecord import EpochEntry
from parascale.training.loop import evaluate
from parascale.training.loop.evaluate import Coverage, announcement, coverage, expected_s
from parascale.training.loop.sampling import eval_sample, eval_shard
from parascale.training.record.target import time_to_target


def test_the_sample_is_the_same_on_any_number_of_ranks_and_at_every_evaluation():
    sample = eval_sample(14_940, 2_400, seed=3)
    assert len(sample) == 2_400 == len(set(sample.tolist()))
    assert torch.equal(sample, sample.sort().values) and 0 <= int(sample.min())
    assert int(sample.max()) < 14_940
    assert torch.equal(sample, eval_sample(14_940, 2_400, seed=3))  # drawn again: the same
    assert not torch.equal(sample, eval_sample(14_940, 2_400, seed=4))
    for world in (1, 2, 3):  # every sample evaluated once, whatever the ranks
        shards = [b for rank in range(world) for b in eval_shard(sample, world, rank, 256)]
        assert torch.equal(torch.cat(shards), sample)
    assert torch.equal(eval_sample(50, 80, seed=3), torch.arange(50))  # more than there are


def test_a_small_split_is_evaluated_whole_and_a_large_token_split_on_a_sample():
    digits = coverage(TrainConfig(), 360, 32, 1.0)
    assert (len(digits.indices), digits.of, digits.seed) == (360, 360, None)
    images = coverage(TrainConfig(), 50_000, 256, 1.0)  # ImageNet's validation set: whole
    assert images.seed is None and len(images.indices) == 50_000
    text = coverage(TrainConfig.of(seed=2), 14_940, 12, 64.0)  # 956,160 tokens
    assert text.section() == {"samples": evaluate.DEFAULT_BATCHES * 12, "of": 14_940, "seed": 2}
    assert torch.equal(text.indices, eval_sample(14_940, evaluate.DEFAULT_BATCHES * 12, 2))
    whole = coverage(TrainConfig.of(eval_batches=0), 14_940, 12, 64.0)
    assert whole.section() == {"samples": 14_940, "of": 14_940, "seed": None}
    asked = coverage(TrainConfig.of(eval_batches=3), 360, 32, 1.0)
    assert asked.section() == {"samples": 96, "of": 360, "seed": 0}
    assert coverage(TrainConfig.of(eval_batches=20), 360, 32, 1.0).seed is None  # covers it all


def test_a_line_comes_before_an_evaluation_expected_to_take_longer_than_a_few_seconds():
    sample = Coverage(torch.arange(2_400), 14_940, 0)
    # a step of 12 samples whose compute takes 0.4 s: a forward pass of 2,400 takes ~27 s
    expected = expected_s(2_400, 12, 0.4)
    assert expected == pytest.approx(2_400 * 0.4 / 12 / 3)
    line = announcement("test", sample, expected)
    assert line == ("parascale: evaluating 2,400 of the 14,940 test samples (drawn by --seed 0, "
                    "the same at every evaluation; --eval-batches 0 evaluates all)...")
    assert announcement("val", Coverage(torch.arange(360), 360, None), None) == \
        "parascale: evaluating the 360 validation samples..."  # nothing says how long
    assert announcement("test", sample, expected_s(2_400, 12, 1e-4)) is None
    assert announcement("test", sample, evaluate.ANNOUNCE_S) is None


def test_the_epoch_entry_and_time_to_target_say_which_samples_were_evaluated():
    cover = {"samples": 2_400, "of": 14_940, "seed": 0}
    entry = EpochEntry(1, True, 4, False, 1.0, [1.0], [1.0], 64, 64.0, 2.0, 0.1, None, None,
                       None, metrics={"test_loss": 1.8}, evaluation={"test": cover},
                       elapsed_s=1.0)
    written = entry.to_dict()
    assert written["evaluation"] == {"test": cover}
    assert EpochEntry.from_dict(written) == entry
    cfg = EvaluationConfig(target_metric="loss", target_value=1.9)
    tta = time_to_target(cfg, {"loss": False}, entry, None)
    assert tta["reached"] and tta["sample"] == cover  # reached on that sample
    entry.evaluation = {"test": {"samples": 360, "of": 360, "seed": None}}
    assert "sample" not in time_to_target(cfg, {"loss": False}, entry, None)


def test_a_negative_budget_is_refused_in_one_line(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--eval-batches", "-1", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["parascale: error: --eval-batches is a number of batches to evaluate, or 0 "
                     "for the whole split; got -1"]
    assert not out.exists()


@pytest.fixture
def world_of_one(monkeypatch):
    """A real world of one rank in this process (gloo on loopback), as a local launch makes."""
    from parascale.runtime import joined
    from parascale.runtime.local import open_store
    from parascale.runtime.world import LOCAL_ENV

    store = open_store()
    for name, value in {LOCAL_ENV: str(store.port), "PARASCALE_RANK": "0",
                        "PARASCALE_WORLD_SIZE": "1", "PARASCALE_LOCAL_RANK": "0",
                        "GLOO_SOCKET_IFNAME": "lo"}.items():
        monkeypatch.setenv(name, value)
    threads = torch.get_num_threads()
    with joined("cpu", "gloo", None, 60, True) as world:
        yield world
    torch.set_num_threads(threads)


def _entry(compute_s: float) -> EpochEntry:
    split = {"data": 0.0, "compute": compute_s, "sync": 0.0, "optimizer": 0.0,
             "step": compute_s}
    return EpochEntry(1, True, 4, False, 1.0, [1.0], [1.0], 32, 32.0, 2.0, 0.1, None, None,
                      split)


@pytest.mark.slow  # builds a run: data, model, FLOP count
def test_the_loop_announces_an_evaluation_by_its_steps_pace_and_repeats_its_sample(
        world_of_one, capsys):
    from parascale.training.loop import setup

    cfg = TrainConfig.of(model="mlp", dataset="synthetic", synthetic_shape=(3, 8, 8),
                      synthetic_size=404, batch_size=8, epochs=1, save_model=False, threads=1,
                      eval_batches=2, noise_scale=False)
    run = setup.set_up(cfg, world_of_one, None)
    capsys.readouterr()
    slow = _entry(10.0)  # 10 s per step of 8 samples: a forward pass of 16 takes ~7 s
    evaluate.evaluate_epoch(run, slow, contextlib.nullcontext)
    said = capsys.readouterr().out
    assert "parascale: evaluating 16 of the 101 test samples (drawn by --seed 0" in said
    assert slow.evaluation == {"test": {"samples": 16, "of": 101, "seed": 0}}
    assert math.isfinite(slow.metrics["test_loss"])
    quick = _entry(1e-6)
    evaluate.evaluate_epoch(run, quick, contextlib.nullcontext)
    assert "evaluating" not in capsys.readouterr().out
    assert quick.metrics == slow.metrics  # the same model on the same sample
