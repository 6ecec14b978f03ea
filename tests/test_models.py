"""The model registry: parascale's models, torchvision names, user functions, checks and probes."""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from helpers import assert_refused
from parascale import models
from parascale.errors import UsageError
from parascale.models.tv import _constructor_kwargs

SHAPES = [((1, 8, 8), 10), ((3, 32, 32), 10), ((1, 28, 28), 7)]
OWN = ["mlp", "smallcnn", "lenet", "resnet20", "resnet32", "resnet56"]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def assert_one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message.strip() == message
    return message


# --- parascale's own models ----------------------------------------------------------------------

def test_names_are_the_registered_models():
    assert models.names() == OWN + ["gpt"]  # gpt takes tokens: tests/test_lm_data.py


@pytest.mark.parametrize("shape,classes", SHAPES)
@pytest.mark.parametrize("name", OWN)
def test_own_models_build_and_give_batch_by_classes(name, shape, classes):
    model = models.build(name, classes, shape)
    models.probe(model, shape, classes)
    out = model(torch.randn(3, *shape))  # train mode, batch size other than the probe's
    assert out.shape == (3, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name,expected", [("resnet20", 0.27e6), ("resnet32", 0.46e6),
                                           ("resnet56", 0.85e6)])
def test_cifar_resnet_sizes_match_the_paper(name, expected):
    count = n_params(models.build(name, 10, (3, 32, 32)))
    assert abs(count - expected) / expected < 0.03, count


def test_lenet_on_28x28_is_the_book_network():
    # D2L's LeNet: 16 * 5 * 5 features into FC 120, 61,706 parameters for 10 classes.
    model = models.build("lenet", 10, (1, 28, 28))
    assert model.classifier[1].in_features == 16 * 5 * 5
    assert n_params(model) == 61706


def test_lenet_skips_pooling_only_when_needed():
    small = models.build("lenet", 10, (1, 8, 8))
    assert sum(isinstance(m, nn.AvgPool2d) for m in small.modules()) == 1
    large = models.build("lenet", 10, (3, 32, 32))
    assert sum(isinstance(m, nn.AvgPool2d) for m in large.modules()) == 2


@pytest.mark.parametrize("name", OWN)
def test_batchnorm_only_in_resnets(name):
    assert models.has_batchnorm(models.build(name, 10, (1, 8, 8))) == name.startswith("resnet")


@pytest.mark.parametrize("name", OWN + ["resnet18"])
def test_builds_are_deterministic_given_the_seed(name):
    def params(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed)
        return list(models.build(name, 10, (3, 32, 32)).state_dict().values())

    first, again, other = params(0), params(0), params(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_resnet_convolutions_use_kaiming_init():
    torch.manual_seed(0)
    model = models.build("resnet56", 10, (3, 32, 32))
    conv = model.stages[2][0].conv2  # 64 * 3 * 3 inputs per output
    expected_std = (2 / (64 * 9)) ** 0.5
    assert abs(conv.weight.std().item() - expected_std) / expected_std < 0.05


def test_own_model_too_small_for_its_input_is_a_usage_error():
    with pytest.raises(UsageError) as exc:
        models.build("lenet", 10, (1, 3, 3))
    message = assert_one_line(exc)
    assert message.startswith("model 'lenet' does not accept inputs of shape (1, 3, 3): ")
    assert "try --image-size 32" in message


@pytest.mark.parametrize("classes,shape", [(0, (1, 8, 8)), (True, (1, 8, 8)), (10, (8, 8)),
                                           (10, (1, 0, 8))])
def test_bad_classes_or_shape_are_usage_errors(classes, shape):
    with pytest.raises(UsageError):
        models.build("mlp", classes, shape)


# --- torchvision ---------------------------------------------------------------------------------

def test_torchvision_names_are_read_from_its_source_as_it_lists_them():
    """An unknown name is refused, and a close one suggested, without importing torchvision:
    the names come from its source files, the same list its registry gives once imported."""
    import torchvision.models as tvm

    from parascale.models.tv import registered_in_source

    assert registered_in_source() == tuple(tvm.list_models(module=tvm))


def test_torchvision_model_builds_and_probes():
    model = models.build("resnet18", 10, (3, 32, 32))
    assert type(model).__module__.startswith("torchvision.")
    models.probe(model, (3, 32, 32), 10)
    assert models.has_batchnorm(model)


def test_torchvision_model_gets_a_channel_adapter():
    model = models.build("resnet18", 7, (1, 32, 32))
    assert isinstance(model.adapter, nn.Conv2d)
    assert (model.adapter.in_channels, model.adapter.out_channels) == (1, 3)
    models.probe(model, (1, 32, 32), 7)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 7)


def test_torchvision_constructor_options_follow_the_model_class():
    # Found from the classes' signatures, so checked without building the big models.
    assert _constructor_kwargs("inception_v3", (3, 299, 299)) == {
        "aux_logits": False, "init_weights": True}
    assert _constructor_kwargs("googlenet", (3, 64, 64))["aux_logits"] is False
    assert _constructor_kwargs("vit_b_16", (3, 64, 64)) == {"image_size": 64}
    assert _constructor_kwargs("resnet18", (3, 64, 64)) == {}


def test_probe_of_torchvision_model_on_too_small_input_suggests_a_size():
    model = models.build("squeezenet1_1", 10, (3, 8, 8))
    with pytest.raises(UsageError) as exc:
        models.probe(model, (3, 8, 8), 10)
    message = assert_one_line(exc)
    assert message.startswith("model 'squeezenet1_1' does not accept inputs of shape (3, 8, 8): ")
    size = int(message.rsplit("try --image-size ", 1)[1])
    models.probe(model, (3, size, size), 10)  # the suggested size works


# --- user models ---------------------------------------------------------------------------------

@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A fresh current directory; sys.path and imported modules are restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write_module(folder, name: str, source: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))


def test_user_model_is_imported_from_the_current_directory(user_dir):
    write_module(user_dir, "mymod", """
        from torch import nn

        def make(num_classes, input_shape):
            c, h, w = input_shape
            return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, num_classes))
    """)
    models.check("mymod:make")
    model = models.build("mymod:make", 5, (2, 8, 8))
    models.probe(model, (2, 8, 8), 5)
    assert model[1].in_features == 2 * 8 * 8 and model[1].out_features == 5


def test_user_model_in_a_package(user_dir):
    (user_dir / "pkg").mkdir()
    write_module(user_dir / "pkg", "__init__", "")
    write_module(user_dir / "pkg", "nets", """
        from torch import nn

        class Net(nn.Linear):
            def __init__(self, num_classes, input_shape):
                super().__init__(input_shape[0], num_classes)
    """)
    assert isinstance(models.build("pkg.nets:Net", 3, (4, 8, 8)), nn.Linear)


@pytest.mark.parametrize("spec,source,expected", [
    ("nosuchmod_xyz:make", None, "module 'nosuchmod_xyz' not found"),
    ("umod_attr:make", "def other(**kw): pass", "has no attribute 'make'"),
    ("umod_value:make", "make = 3", "is a int, not a function"),
    ("umod_import:make", "import nosuchdep_xyz", "No module named 'nosuchdep_xyz'"),
    ("umod_syntax:make", "def make(:", "SyntaxError"),
    ("umod_noformat:", None, "expected 'package.module:function'"),
])
def test_bad_user_module_or_function(user_dir, spec, source, expected):
    if source is not None:
        write_module(user_dir, spec.split(":")[0], source)
    for action in (lambda: models.check(spec), lambda: models.build(spec, 10, (1, 8, 8))):
        with pytest.raises(UsageError) as exc:
            action()
        assert expected in assert_one_line(exc)


@pytest.mark.parametrize("source,expected", [
    ("def make(num_classes, input_shape):\n    return 'a model'",
     "returned a str, not a torch.nn.Module"),
    ("def make(classes):\n    pass", "must accept keyword arguments num_classes and input_shape"),
])
def test_user_function_with_wrong_result_or_signature(user_dir, source, expected):
    write_module(user_dir, "umod_result", source)
    models.check("umod_result:make")  # callable, so it passes the cheap check
    with pytest.raises(UsageError) as exc:
        models.build("umod_result:make", 10, (1, 8, 8))
    assert expected in assert_one_line(exc)


# --- names ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", OWN + ["resnet50", "vgg16", "vit_b_16"])
def test_check_accepts_known_names(name):
    models.check(name)


@pytest.mark.parametrize("name,suggestion", [
    ("resnet2", "resnet20"), ("lenett", "lenet"), ("SmallCNN", "smallcnn"),
    ("mobilenetv2", "mobilenet_v2"),
])
def test_unknown_name_lists_models_and_suggests_the_closest(name, suggestion):
    for action in (lambda: models.check(name), lambda: models.build(name, 10, (1, 8, 8))):
        with pytest.raises(UsageError) as exc:
            action()
        message = assert_one_line(exc)
        assert f"unknown model {name!r} (did you mean {suggestion!r}?)" in message
        assert ", ".join(OWN) in message
        assert "torchvision" in message and "resnet50" in message
        assert "'package.module:function'" in message


def test_unknown_name_without_a_close_match_still_lists_models():
    with pytest.raises(UsageError) as exc:
        models.check("qqqqqqqq")
    message = assert_one_line(exc)
    assert "did you mean" not in message and ", ".join(OWN) in message


# --- probe ---------------------------------------------------------------------------------------

def test_probe_rejects_wrong_output_shape():
    model = models.build("mlp", 5, (1, 8, 8))
    with pytest.raises(UsageError) as exc:
        models.probe(model, (1, 8, 8), 10)
    message = assert_one_line(exc)
    assert message.startswith("model 'mlp' does not accept inputs of shape (1, 8, 8): ")
    assert "(2, 5), expected (2, 10)" in message
    assert "--image-size" not in message  # no image size gives 10 outputs


def test_probe_names_a_model_it_did_not_build():
    with pytest.raises(UsageError) as exc:
        models.probe(nn.Conv2d(1, 4, 3), (1, 8, 8), 4, name="conv")
    assert assert_one_line(exc).startswith("model 'conv' does not accept")
    with pytest.raises(UsageError, match="^model 'Conv2d' "):
        models.probe(nn.Conv2d(1, 4, 3), (1, 8, 8), 4)


def test_probe_on_input_the_model_was_not_built_for_suggests_its_size():
    model = models.build("smallcnn", 10, (1, 28, 28))
    with pytest.raises(UsageError) as exc:
        models.probe(model, (1, 32, 32), 10)
    message = assert_one_line(exc)
    assert "shape (1, 32, 32): mat1 and mat2 shapes cannot be multiplied" in message
    assert message.endswith("; try --image-size 28")


def test_probe_leaves_modes_and_state_untouched():
    torch.manual_seed(0)
    model = models.build("resnet20", 10, (3, 16, 16))
    model.train()
    model.stages[0].eval()  # a caller's frozen part keeps its own mode
    before = {k: v.clone() for k, v in model.state_dict().items()}
    models.probe(model, (3, 16, 16), 10)
    assert model.training and model.fc.training and not model.stages[0][0].bn1.training
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BN statistics included


def test_timm_models_by_name():
    import torch

    from parascale import models
    from parascale.errors import UsageError

    model = models.build("timm:resnetv2_18", 10, (1, 16, 16))  # channels and classes follow
    assert model(torch.zeros(2, 1, 16, 16)).shape == (2, 10)
    with pytest.raises(UsageError, match="did you mean 'timm:resnetv2_50'"):
        models.check("timm:resnetv2_5")
    with pytest.raises(UsageError, match="timm:NAME"):
        models.check("resnetv2_50")


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
