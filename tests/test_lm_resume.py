"""The GPT stopped after a checkpoint and resumed ends with exactly the parameters of a run
that was never stopped: the token windows shard and resume like any other data, and AdamW's
state travels in the checkpoint."""
import pytest
import torch

from conftest import run_training

pytestmark = pytest.mark.slow  # every test here starts worker processes

RUN = dict(model="gpt", dataset="shakespeare", context=16, gpt_layers=2, gpt_heads=2,
           gpt_width=32, workers=2, global_batch=8, steps=6, optimizer="adamw", lr=0.01,
           adam_beta2=0.99, weight_decay=0.1, clip_grad_norm=0.5, warmup_steps=2,
           lr_schedule="cosine", lr_min=1e-3, seed=5, evaluate_test=False, val_fraction=0.01,
           timeout=60.0)


def test_a_resumed_gpt_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path, monkeypatch):
    _, expected = run_training(tmp_path / "whole", **RUN)
    out = tmp_path / "cut"
    monkeypatch.setenv("PARASCALE_FAULT", "raise@1:5")
    stopped, _ = run_training(out, expect="failed", checkpoint_every=3, **RUN)
    assert "injected fault on rank 1 at step 5" in stopped["reason"]
    monkeypatch.delenv("PARASCALE_FAULT")
    record, resumed = run_training(out, checkpoint_every=3, resume=True, **RUN)
    assert record["resumed"][0]["step"] == 3
    assert resumed.keys() == expected.keys()
    assert all(torch.equal(resumed[k], expected[k]) for k in expected)
