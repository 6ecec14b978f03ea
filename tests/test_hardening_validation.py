"""Issue 16: input checks and faults inside training, each one line for the user.

Bad input (non-finite or wrongly typed options, user models that raise or have nothing to
train, a malformed PARASCALE_FAULT, unreadable image files) is refused before any worker starts;
known failures during training (a diverging loss, a bad data file) end the job with one line.
"""
from __future__ import annotations

import dataclasses
import math
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
        optional = isinstance(annotation, types.UnionType)
        kinds[name] = (args[0] if optional else annotation, optional)
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
    """A value of another type than ``kind``."""
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
