"""The training configuration checks its values: finite floats, the types its annotations
name (from the Python API as from the command line), and PARASCALE_FAULT; each one line."""

import math
import types
import typing

import pytest

import parascale
from helpers import assert_refused, one_line
from parascale.config import TrainConfig
from parascale.errors import UsageError


def field_kinds() -> dict[str, tuple[object, bool]]:
    """Each setting's type and whether it may be None, read here from the annotations of the
    configuration's sections (not from the code under test)."""
    kinds = {}
    for section in typing.get_type_hints(TrainConfig).values():
        kinds.update(_kinds(section))
    return kinds


def _kinds(section: type) -> dict[str, tuple[object, bool]]:
    kinds = {}
    for name, annotation in typing.get_type_hints(section).items():
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        union = isinstance(annotation, types.UnionType)
        optional = union and len(args) < len(typing.get_args(annotation))
        # int | str (--learners 4 or auto) stays a union of both
        kinds[name] = (annotation if union and len(args) > 1 else args[0] if union
                       else annotation, optional)
    return kinds


@pytest.mark.parametrize("option, value", [
    ("--lr", "nan"), ("--lr", "inf"), ("--momentum", "nan"), ("--timeout", "nan"),
    ("--timeout", "inf"), ("--bucket-mb", "nan"), ("--warmup-epochs", "nan"),
    ("--weight-decay", "inf"),
])
def test_non_finite_float_option_is_one_line(capsys, tmp_path, option, value):
    assert_refused(capsys, tmp_path, option, value, words=(option, "finite", value))


@pytest.mark.parametrize("value", ["1e-300", "0.0001"])
def test_a_peak_below_any_device_is_one_line(capsys, tmp_path, value):
    """Its MFU would print hundreds of digits: a device that trains does 1 GFLOP/s or more."""
    assert_refused(capsys, tmp_path, "--peak-tflops", value,
                   words=("--peak-tflops must be at least 0.001 (1 GFLOP/s)", f"got {value}"))


def test_every_float_field_is_checked_for_being_finite():
    floats = [name for name, (kind, _) in field_kinds().items() if kind is float]
    assert {"lr", "momentum", "timeout", "warmup_epochs"} <= set(floats)
    for name in floats:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(UsageError) as exc:
                TrainConfig.of(**{name: bad}).validate()
            assert one_line(exc).startswith(f"--{name.replace('_', '-')} must be a finite number")


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
    for name, (kind, _optional) in field_kinds().items():
        with pytest.raises(UsageError) as exc:
            TrainConfig.from_dict({name: _wrong_value(kind)})
        assert one_line(exc).startswith(f"{name} must be "), exc.value
        cfg = TrainConfig.of(**{name: _wrong_value(kind)})  # built directly, checked by validate
        with pytest.raises(UsageError, match=f"^{name} must be "):
            cfg.validate()


def test_api_accepts_ints_for_floats_and_lists_for_tuples():
    cfg = TrainConfig.from_dict({"lr": 1, "timeout": 30, "synthetic_shape": [1, 8, 8],
                                 "lr_milestones": [2, 3], "gpus": [0, 1]})
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert isinstance(cfg.processes.timeout, float)
    assert cfg.data.synthetic_shape == (1, 8, 8) and cfg.optim.lr_milestones == (2, 3)
    assert cfg.processes.gpus == (0, 1)
    cfg.replace(gpus=None).validate()
    # what the launcher sends its workers reads back the same
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("text", ["explode@1", "kill@1", "raise@1:2,slow@x:1"])
def test_malformed_fault_is_refused_in_preflight(capsys, tmp_path, monkeypatch, text):
    monkeypatch.setenv("PARASCALE_FAULT", text)
    assert_refused(capsys, tmp_path, "--workers", "1", "--epochs", "1",
                   words=("PARASCALE_FAULT", "cannot read", "kill@R:S"))
