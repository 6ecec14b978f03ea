"""The language model's epoch line says its perplexity beside the loss, as the record has it."""
import math

from parascale import tasks
from parascale.batch import make_plan
from parascale.config import TrainConfig
from parascale.runrecord import EpochEntry
from parascale.training.loop.lines import epoch_line


def test_the_gpts_epoch_line_and_entry_carry_perplexity():
    cfg = TrainConfig.of(model="gpt", dataset="shakespeare", context=16, gpt_layers=1,
                         gpt_heads=1, gpt_width=16, batch_size=8, steps=4)
    task, bundle = tasks.prepare(cfg)
    plan = make_plan(cfg, 1, len(bundle.train), len(bundle.test), replicas=1)
    entry = EpochEntry(1, True, 4, False, 1.0, [1.0], [1.0], 32, 100.0, 2.5, 0.1, None, None,
                       None, unit=task.throughput_unit(),
                       metrics={"test_loss": 2.0, "test_accuracy": 0.4, "val_loss": 2.2,
                                "val_accuracy": 0.35})
    written = entry.to_dict()  # per-token figures from the task's unit alone
    assert written["test_perplexity"] == math.exp(2.0)
    assert written["val_perplexity"] == math.exp(2.2) and written["tokens_per_s"] == 1600.0
    line = epoch_line(entry, plan, task)
    assert "1,600 tokens/s" in line
    assert f"test loss 2.0000, accuracy 40.00%, perplexity {math.exp(2.0):.2f}" in line
    assert f"validation accuracy 35.00%, perplexity {math.exp(2.2):.2f}" in line
