"""The configuration in sections (issue 31): each section validates itself in one line that
quotes the value; what spans sections is checked after them; the flat boundary (records, study
files, ``parascale.train({...})``) keeps every key, its value and its order; --help shows one
group per section."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from helpers import one_line
from parascale import sync
from parascale.cli.main import main
from parascale.cli.options import TITLES, field_docs
from parascale.config import (NAMES, SECTIONS, BatchConfig, CheckpointConfig, DataConfig,
                              EvaluationConfig, JobConfig, MeasureConfig, OptimConfig,
                              OutputConfig, ProcessConfig, StrategyConfig, TrainConfig)
from parascale.errors import UsageError

RECORDS = Path(__file__).resolve().parent / "records"
RECORD_FILES = sorted(RECORDS.glob("*.json")) + sorted(RECORDS.glob("bench-*/runs/*/record.json"))


@pytest.mark.parametrize("section, words", [
    (JobConfig(gpt_width=100, gpt_heads=3), ["--gpt-width 100", "--gpt-heads 3", "--gpt-width 96"]),
    (JobConfig(gpt_layers=0), ["--gpt-layers", "got 0"]),
    (JobConfig(task="mine"), ["--task", "'mine'"]),
    (DataConfig(val_fraction=1.5), ["--val-fraction", "got 1.5"]),
    (DataConfig(synthetic_shape=(3, 0, 32)), ["--synthetic-shape", "(3, 0, 32)"]),
    (DataConfig(loader_workers=-1), ["--loader-workers", "got -1"]),
    (DataConfig(image_size=0), ["--image-size", "got 0"]),
    (DataConfig(data_dir=" "), ["--data-dir", "' '", "empty"]),
    (ProcessConfig(port=70000), ["--port", "got 70000"]),
    (ProcessConfig(workers=3, gpus=(0, 1)), ["--workers 3", "--gpus 0,1"]),
    (ProcessConfig(gpus=(0, 0)), ["--gpus", "(0, 0)"]),
    (ProcessConfig(timeout=0.0), ["--timeout", "got 0.0"]),
    (ProcessConfig(device="tpu"), ["--device", "'tpu'"]),
    (BatchConfig(batch_size=8, global_batch=16), ["not both", "got 8 and 16"]),
    (BatchConfig(epochs=2, steps=10), ["not both", "got 2 and 10"]),
    (BatchConfig(accumulate=0), ["--accumulate", "got 0"]),
    (OptimConfig(lr=1e5), ["--lr", "[1e-10, 10000]", "got 100000"]),
    (OptimConfig(lr=0.1, lr_min=0.5), ["--lr-min", "--lr 0.1", "got 0.5"]),
    (OptimConfig(momentum=-0.5), ["must not be negative", "got -0.5, 0 and 0"]),
    (OptimConfig(warmup_steps=5, warmup_epochs=1.0), ["not both", "got 5 and 1"]),
    (OptimConfig(lr_gamma=2.0), ["--lr-gamma", "got 2.0"]),
    (OptimConfig(clip_grad_norm=0.0), ["--clip-grad-norm", "got 0.0"]),
    (OptimConfig(adam_beta2=1.0), ["--adam-beta2", "got 1.0"]),
    (OptimConfig(optimizer="lamb"), ["--optimizer", "'lamb'"]),
    (StrategyConfig(precision="fp8"), ["--precision", "'fp8'"]),
    (StrategyConfig(sync_options=["a"]), ["sync_options", "mapping", "['a']"]),
    (EvaluationConfig(target_accuracy=90.0), ["--target-accuracy", "got 90.0"]),
    (EvaluationConfig(eval_every=0), ["--eval-every", "got 0"]),
    (EvaluationConfig(stop_at_target=True), ["--stop-at-target", "--target-accuracy"]),
    (MeasureConfig(profile="5:2"), ["--profile", "'5:2'"]),
    (MeasureConfig(peak_tflops=-1.0), ["--peak-tflops", "got -1.0"]),
    (OutputConfig(out=" "), ["--out", "' '", "empty"]),
    (OutputConfig(tensorboard=""), ["--tensorboard", "''", "empty"]),
    (CheckpointConfig(keep=0), ["--keep", "got 0"]),
    (CheckpointConfig(checkpoint_every="2x"), ["--checkpoint-every", "'2x'"]),
    (CheckpointConfig(max_restarts=-1), ["--max-restarts", "got -1"]),
], ids=lambda v: type(v).__name__ if dataclasses.is_dataclass(v) else None)
def test_each_section_refuses_a_bad_value_in_one_line_quoting_it(section, words):
    with pytest.raises(UsageError) as exc:
        section.validate()
    line = one_line(exc)
    for word in words:
        assert word in line, (word, line)
    # the section refuses it inside the configuration with the same line
    with pytest.raises(UsageError, match=re.escape(line)):
        TrainConfig.of(**dataclasses.asdict(section)).validate()


def test_each_section_at_its_defaults_passes():
    for kind in SECTIONS.values():
        kind().validate()
    TrainConfig().validate()


def test_the_sections_are_checked_in_order_then_what_spans_them():
    both = TrainConfig.of(gpt_layers=0, keep=0)  # the job's fault comes before the checkpoint's
    with pytest.raises(UsageError, match="--gpt-layers"):
        both.validate()
    with pytest.raises(UsageError, match="--no-evaluate-test needs a validation split"):
        TrainConfig.of(evaluate_test=False).validate()
    TrainConfig.of(evaluate_test=False, val_fraction=0.2).validate()
    with pytest.raises(UsageError, match="--context does not apply with --task"):
        TrainConfig.of(task="pkg.mod:task", context=32).validate()


def test_setting_names_are_unique_flags_and_each_is_documented():
    names = [f.name for kind in SECTIONS.values() for f in dataclasses.fields(kind)]
    assert len(names) == len(set(names)) and sorted(names) == sorted(NAMES)
    assert not set(SECTIONS) & set(names)  # a section is never mistaken for a setting
    assert set(field_docs()) == set(NAMES) and all(field_docs().values())
    assert set(TITLES) == set(SECTIONS)


def _every_setting_changed() -> dict:
    """A flat dict with every setting away from its default (valid types, not a valid run)."""
    return {
        "task": "pkg.mod:task", "model": "gpt", "dataset": "shakespeare", "context": 16,
        "gpt_layers": 1, "gpt_heads": 2, "gpt_width": 32, "data_dir": "data",
        "download": True, "image_size": 28, "synthetic_shape": [1, 8, 8], "synthetic_size": 64,
        "num_classes": 3, "augment": True, "verify_data": True, "workers": 2, "gpus": [0, 1],
        "device": "cuda", "backend": "nccl", "threads": 2, "oversubscribe": True,
        "device_memory": "1GiB", "batch_size": 8, "global_batch": 16, "accumulate": 2,
        "epochs": 4, "steps": 9, "lr": 0.2, "lr_scaling": "linear", "base_batch": 32,
        "warmup_epochs": 1.5, "warmup_steps": 3, "lr_schedule": "step", "lr_milestones": [2, 3],
        "lr_gamma": 0.5, "lr_min": 0.01, "optimizer": "adamw", "momentum": 0.5,
        "weight_decay": 0.1, "clip_grad_norm": 1.0, "adam_beta2": 0.99, "seed": 7,
        "val_fraction": 0.2, "evaluate_test": False, "precision": "bf16", "sync_batchnorm": True,
        "loader_workers": 2, "compile": True, "peak_tflops": 1.5, "sync": "local-sgd",
        "period": 4, "target_accuracy": 0.9, "target_metric": "loss", "target_value": 1.5,
        "stop_at_target": True, "eval_every": 2, "eval_batches": 5, "noise_scale": False, "profile": "2:3",
        "port": 29500, "timeout": 30.0, "max_restarts": 2, "out": "runs/a", "save_model": False,
        "tensorboard": "tb", "checkpoint_every": "1e", "keep": 2, "resume": True,
    }


def test_a_config_touching_every_setting_goes_flat_and_back_unchanged():
    flat = _every_setting_changed()
    cfg = TrainConfig.from_dict(flat)
    default = TrainConfig()
    assert [n for n in NAMES if cfg.value(n) == default.value(n)] == []
    assert (cfg.optim.lr, cfg.batch.batch_size, cfg.data.synthetic_shape) == (0.2, 8, (1, 8, 8))
    assert cfg.strategy.sync_options == {"period": 4}
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    # flat, in the order of before the sections, each option where sync_options stood
    assert list(cfg.to_dict()) == [k for n in NAMES for k in
                                   (["period"] if n == "sync_options" else [n])]
    assert cfg.to_dict() == flat


def test_of_and_replace_name_settings_flat_and_copy_every_section():
    cfg = TrainConfig.of(workers=2, lr=0.1, sync_options={"period": 2})
    assert cfg == TrainConfig(processes=ProcessConfig(workers=2), optim=OptimConfig(lr=0.1),
                              strategy=StrategyConfig(sync_options={"period": 2}))
    other = cfg.replace(workers=4, out="runs/b")
    assert (other.processes.workers, other.output.out, other.optim.lr) == (4, "runs/b", 0.1)
    assert cfg.processes.workers == 2 and cfg.output.out is None  # the original is untouched
    assert all(a is not b for a, b in zip(cfg.sections(), other.sections()))
    settled = sync.settled(cfg)  # settling a copy in place leaves the original as it was
    assert cfg.strategy.sync is None and settled.strategy.sync is not None
    with pytest.raises(TypeError, match="no setting 'lrr'; did you mean lr"):
        TrainConfig.of(lrr=0.1)
    with pytest.raises(TypeError, match="no setting 'optim'"):
        cfg.replace(optim=OptimConfig())


@pytest.mark.parametrize("path", RECORD_FILES, ids=lambda p: str(p.relative_to(RECORDS)))
def test_every_record_reads_into_a_config_and_writes_its_keys_back(path):
    written = json.loads(path.read_text())["config"]
    flat = TrainConfig.from_dict(written).to_dict()
    # before the strategies declared their options, a record could hold them in a mapping
    written = {**{k: v for k, v in written.items() if k != "sync_options"},
               **written.get("sync_options", {})}
    assert {k: flat[k] for k in written} == written
    if set(flat) == set(written):  # a record of the layout of today: the same order too
        assert list(flat) == list(written)


def test_the_newest_record_lists_its_config_in_the_order_of_today():
    today = set(sync.settled(TrainConfig()).to_dict())
    newest = [p for p in RECORD_FILES if set(json.loads(p.read_text())["config"]) == today]
    assert newest, "a record whose config has exactly today's keys"


def test_help_shows_one_group_per_section_with_its_flags(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    groups: dict[str, list[str]] = {}
    current = None
    for line in capsys.readouterr().out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = groups.setdefault(line[:-1], [])
        elif current is not None and re.match(r"  --[a-z]", line):
            current.append(line.split()[0].rstrip(","))
    for section, kind in SECTIONS.items():
        wanted = ["--" + f.name.replace("_", "-") for f in dataclasses.fields(kind)]
        if section == "strategy":  # the strategies' own flags follow --sync
            wanted[1:1] = ["--" + n.replace("_", "-") for n, (o, _) in sync.options().items()
                           if o.flag]
            wanted[wanted.index("--sync-options")] = "--sync-option"
        assert groups[TITLES[section]] == wanted, section
    assert list(groups)[1:len(SECTIONS) + 1] == [TITLES[s] for s in SECTIONS]  # after "options"
