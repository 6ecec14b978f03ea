"""Issue 16: input checks and faults inside training, each one line for the user.

Bad input (non-finite or wrongly typed options, user models that raise or have nothing to
train, a malformed PARASCALE_FAULT, unreadable image files) is refused before any worker starts;
known failures during training (a diverging loss, a bad data file) end the job with one line.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
import types
import typing

import pytest

import parascale
from parascale.cli.main import main
from parascale.config import TrainConfig, validate
from parascale.errors import UsageError


def field_kinds() -> dict[str, tuple[object, bool]]:
    """Each TrainConfig field's type and whether it may be None, read here from the annotations
    (not from the code under test)."""
    kinds = {}
    for name, annotation in typing.get_type_hints(TrainConfig).items():
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        union = isinstance(annotation, types.UnionType)
        optional = union and len(args) < len(typing.get_args(annotation))
        # int | str (--learners 4 or auto) stays a union of both
        kinds[name] = (annotation if union and len(args) > 1 else args[0] if union
                       else annotation, optional)
    return kinds


def run_cli(capsys, *args) -> tuple[int, str]:
    code = main(["train", *args])
    return code, capsys.readouterr().err


def assert_refused(capsys, tmp_path, *args, words=()) -> str:
    """Exit code 2, one line naming ``words``, nothing written."""
    out = tmp_path / "out"
    code, err = run_cli(capsys, *args, "--out", str(out))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("parascale: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()
    return lines[0]


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


# --- item 3: float options must be finite -------------------------------------------------------

@pytest.mark.parametrize("option, value", [
    ("--lr", "nan"), ("--lr", "inf"), ("--momentum", "nan"), ("--timeout", "nan"),
    ("--timeout", "inf"), ("--bucket-mb", "nan"), ("--warmup-epochs", "nan"),
    ("--weight-decay", "inf"),
])
def test_non_finite_float_option_is_one_line(capsys, tmp_path, option, value):
    assert_refused(capsys, tmp_path, option, value, words=(option, "finite", value))


def test_every_float_field_is_checked_for_being_finite():
    floats = [name for name, (kind, _) in field_kinds().items() if kind is float]
    assert {"lr", "momentum", "timeout", "bucket_mb", "warmup_epochs"} <= set(floats)
    for name in floats:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(UsageError) as exc:
                validate(TrainConfig(**{name: bad}))
            assert one_line(exc).startswith(f"--{name.replace('_', '-')} must be a finite number")


# --- item 8: types from the Python API ----------------------------------------------------------

@pytest.mark.parametrize("options, words", [
    ({"lr": "0.1"}, ["lr", "'0.1'", "a number"]),
    ({"synthetic_shape": "abc"}, ["synthetic_shape", "'abc'", "list of integers"]),
    ({"gpus": "0,1"}, ["gpus", "'0,1'", "list of integers"]),
    ({"workers": True}, ["workers", "True", "an integer"]),
    ({"epochs": 2.0}, ["epochs", "2.0", "an integer"]),
    ({"augment": "yes"}, ["augment", "'yes'", "true or false"]),
    ({"lr_milestones": [1.5]}, ["lr_milestones", "[1.5]", "list of integers"]),
    ({"sync_options": ["a"]}, ["sync_options", "mapping"]),
])
def test_api_types_are_checked_where_the_config_is_built(tmp_path, options, words):
    with pytest.raises(UsageError) as exc:
        parascale.train({**options, "workers": options.get("workers", 1),
                         "out": str(tmp_path / "out")})
    message = one_line(exc)
    for word in words:
        assert word in message, (word, message)
    assert not (tmp_path / "out").exists()


def _wrong_value(kind) -> object:
    """A value of another type than ``kind`` (a count-or-word field, --learners: a float)."""
    if isinstance(kind, types.UnionType):
        return 1.5
    return 1 if kind is str else "1"


def test_every_field_is_type_checked_from_its_annotation():
    for name, (kind, optional) in field_kinds().items():
        with pytest.raises(UsageError) as exc:
            TrainConfig.from_dict({name: _wrong_value(kind)})
        assert one_line(exc).startswith(f"{name} must be "), exc.value
        cfg = TrainConfig(**{name: _wrong_value(kind)})  # built directly, checked by validate
        with pytest.raises(UsageError, match=f"^{name} must be "):
            validate(cfg)


def test_api_accepts_ints_for_floats_and_lists_for_tuples():
    cfg = TrainConfig.from_dict({"lr": 1, "timeout": 30, "synthetic_shape": [1, 8, 8],
                                 "lr_milestones": [2, 3], "gpus": [0, 1]})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and isinstance(cfg.timeout, float)
    assert cfg.synthetic_shape == (1, 8, 8) and cfg.lr_milestones == (2, 3)
    assert cfg.gpus == (0, 1)
    validate(dataclasses.replace(cfg, gpus=None))
    # what the launcher sends its workers reads back the same
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


# --- item 5: user models that raise, exit or have nothing to train ------------------------------

@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A fresh current directory for user modules (umod_*), forgotten afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("umod_")]:
        del sys.modules[name]


@pytest.mark.parametrize("module, body, words", [
    ("umod_raises", "raise ValueError('no such width: 7')",
     ["'umod_raises:make'", "make(num_classes=10, input_shape=(1, 8, 8)) raised ValueError: "
      "no such width: 7", "umod_raises.py:5"]),
    ("umod_exits", "raise SystemExit(0)",
     ["'umod_exits:make'", "make(num_classes=10, input_shape=(1, 8, 8)) exited (SystemExit(0))",
      "umod_exits.py:5"]),
    ("umod_empty", "return Slice(num_classes)",
     ["'umod_empty:make'", "returned a Slice without trainable parameters"]),
])
def test_user_model_failures_are_one_line_before_any_worker(capsys, user_dir, module, body,
                                                            words):
    (user_dir / f"{module}.py").write_text(textwrap.dedent(f"""\
        from torch import nn


        def make(num_classes, input_shape):
            {body}


        class Slice(nn.Module):  # the right output shape, but nothing to train
            def __init__(self, k):
                super().__init__()
                self.k = k

            def forward(self, x):
                return x.flatten(1)[:, :self.k]
        """))
    # the launcher creates --out, so its absence shows no worker started
    assert_refused(capsys, user_dir, "--model", f"{module}:make", "--workers", "1",
                   words=words)


# --- item 7: a malformed PARASCALE_FAULT --------------------------------------------------------

@pytest.mark.parametrize("text", ["explode@1", "kill@1", "raise@1:2,slow@x:1"])
def test_malformed_fault_is_refused_in_preflight(capsys, tmp_path, monkeypatch, text):
    monkeypatch.setenv("PARASCALE_FAULT", text)
    assert_refused(capsys, tmp_path, "--workers", "1", "--epochs", "1",
                   words=("PARASCALE_FAULT", "cannot read", "kill@R:S"))


# --- item 17: a diverging loss, caught at the step, with advice that fits -----------------------

def _cli(tmp_path, *args, fault: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PARASCALE_FAULT": fault} if fault else dict(os.environ)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "parascale", "train", *args, "--timeout", "30",
                           "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=240)
    return proc, json.loads((out / "record.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("sync, where", [
    ("allreduce", "at step 3 on rank 1 (of 2); epoch 1, learning rate 0.05, no warm-up"),
    ("none", "at step 3 on rank 1 (decided by that rank alone"),
])
def test_divergence_is_named_by_step_and_rank_in_one_line(tmp_path, sync, where):
    proc, record = _cli(tmp_path, "--workers", "2", "--epochs", "1", "--sync", sync,
                        fault="nan@1:3")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("parascale: failed: rank 1 failed: training loss is nan " + where), \
        last
    assert record["status"] == "failed" and record["reason"] in last
    assert "NonFiniteLoss" in record["detail"] and "Traceback" in record["detail"]


WATCH_WORKER = """\
import json, os, pathlib, torch
from parascale.runtime import joined
from parascale.runtime.failure import serve_as_worker
from parascale.training.divergence import DivergenceWatch, NonFiniteLoss


def body():
    out = pathlib.Path(os.environ["WATCH_OUT"])
    with joined("cpu", "gloo", None, 30.0, teardown=False) as world:
        watch = DivergenceWatch(world, os.environ["WATCH_COLLECTIVE"] == "1",
                                lambda step, rate: f"advice for rate {rate}")
        for step in range(1, 6):
            bad = world.rank == 1 and step == 3
            watch.observe(step, torch.tensor(float("nan") if bad else 1.0), 0.1 * step)
            try:
                watch.settle()
            except NonFiniteLoss as exc:
                report = {"at": step, "secondary": exc.secondary, "message": str(exc)}
                (out / f"rank{world.rank}.json").write_text(json.dumps(report))
                raise
        (out / f"rank{world.rank}.json").write_text(json.dumps({"at": None}))


serve_as_worker(body)
"""


@pytest.mark.slow
@pytest.mark.parametrize("collective", [True, False])
def test_divergence_decision_is_the_same_on_every_rank_only_when_collective(tmp_path,
                                                                           collective):
    from parascale.runtime import launch

    (tmp_path / "watch_worker.py").write_text(WATCH_WORKER)
    paths = os.pathsep.join([str(tmp_path)] + sys.path)
    outcome = launch("watch_worker", 2, {"PYTHONPATH": paths, "WATCH_OUT": str(tmp_path),
                                         "WATCH_COLLECTIVE": "1" if collective else "0"})
    assert outcome.status == "failed" and outcome.rank == 1, outcome
    assert "Traceback" in outcome.detail and "NonFiniteLoss" in outcome.detail
    one = json.loads((tmp_path / "rank1.json").read_text())
    assert not one["secondary"] and one["at"] in (3, 4)  # decided after the step, or the next
    assert one["message"].startswith("training loss is nan at step 3 on rank 1")
    assert one["message"].endswith("advice for rate 0.30000000000000004")  # step 3's rate
    zero = tmp_path / "rank0.json"
    if collective:  # rank 0 stopped at the same point, leaving the blame to rank 1
        assert json.loads(zero.read_text()) == {**one, "secondary": True}
    else:  # rank 0 never learnt of it: no per-step collective
        assert not zero.exists() or json.loads(zero.read_text())["at"] is None


def _advice(step: int = 3, rate: float = 0.8, **options) -> str:
    from parascale.batch import derive
    from parascale.training.divergence import advice

    cfg = TrainConfig(**options)
    derived = derive(cfg, 8)
    return advice(cfg, derived, steps_per_epoch=10, warmup_steps=round(cfg.warmup_epochs * 10),
                  step=step, rate=rate)


def test_divergence_advice_fits_the_settings():
    scaled = _advice(lr=0.1, lr_scaling="linear", batch_size=32, precision="fp16")
    assert "linear scaling of --lr 0.1 from batch 32 to 256 gives 0.8" in scaled
    assert "no warm-up" in scaled and "momentum 0.9 (steps up to 10x the rate)" in scaled
    for lever in ("--warmup-epochs", "--lr-scaling sqrt", "--precision bf16", "lower --lr",
                  "lower --momentum (now 0.9)"):
        assert lever in scaled, (lever, scaled)

    warming = _advice(step=13, rate=0.3, lr=0.1, lr_scaling="sqrt", batch_size=32,
                      warmup_epochs=2, momentum=0.0)
    assert "epoch 2 (its step 3)" in warming and "in warm-up (step 13 of 20)" in warming
    assert "a longer --warmup-epochs" in warming
    for absent in ("momentum", "--lr-scaling sqrt", "precision"):
        assert absent not in warming, (absent, warming)

    plain = _advice(rate=0.05)
    assert plain.endswith("try a lower --lr (now 0.05), or a lower --momentum (now 0.9)")
    assert "\n" not in scaled + warming + plain


# --- item 18: unreadable images -----------------------------------------------------------------

def image_tree(root, broken=(), sizes=None) -> int:
    """train/{a,b}/ and val/{a,b}/ of 8x8 PNGs (3 per class each); ``broken`` names files
    written as garbage, ``sizes`` maps names to another (width, height). Returns the count."""
    import numpy as np
    from PIL import Image

    count = 0
    for split in ("train", "val"):
        for cls in ("a", "b"):
            for i in range(3):
                name = f"{split}-{cls}{i}.png"
                path = root / split / cls / name
                path.parent.mkdir(parents=True, exist_ok=True)
                count += 1
                if name in broken:
                    path.write_bytes(b"not a png at all")
                    continue
                size = (sizes or {}).get(name, (8, 8))
                pixels = np.random.default_rng(count).integers(0, 256, (size[1], size[0], 3))
                Image.fromarray(pixels.astype(np.uint8)).save(path)
    return count


@pytest.mark.slow
def test_unreadable_image_during_training_is_one_line_naming_it(tmp_path):
    # --image-size: preflight reads no image, so the bad file is met by a batch
    image_tree(tmp_path / "data", broken=("train-b1.png",))
    proc, record = _cli(tmp_path, "--dataset", "imagefolder", "--data-dir",
                        str(tmp_path / "data"), "--image-size", "8", "--model", "mlp",
                        "--workers", "2", "--batch-size", "3", "--epochs", "1")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    bad = tmp_path / "data" / "train" / "b" / "train-b1.png"
    assert f"failed: imagefolder: cannot read {bad}: " in last, last
    assert record["status"] == "failed" and "UnidentifiedImageError" in record["detail"]


def test_verify_data_names_the_first_bad_image_and_counts_them(capsys, tmp_path):
    total = image_tree(tmp_path / "data", broken=("train-a2.png", "val-b0.png"))
    line = assert_refused(capsys, tmp_path, "--dataset", "imagefolder", "--data-dir",
                          str(tmp_path / "data"), "--image-size", "8", "--verify-data",
                          words=[f"cannot read {tmp_path / 'data' / 'train' / 'a' / 'train-a2.png'}",
                                 f"2 of {total} images cannot be read"])
    assert "val-b0.png" not in line


def test_verify_data_finds_sizes_that_differ_beyond_the_sampled_images(tmp_path):
    from parascale import data

    image_tree(tmp_path, sizes={"train-a1.png": (9, 8)})  # not the first of its class
    cfg = TrainConfig(dataset="imagefolder", data_dir=str(tmp_path))
    data.check(cfg)  # one image per class: all 8x8
    with pytest.raises(UsageError) as exc:
        data.check(dataclasses.replace(cfg, verify_data=True))
    assert "differ in size" in one_line(exc) and "train-a1.png is 9x8" in one_line(exc)
    data.check(dataclasses.replace(cfg, verify_data=True, image_size=8))
