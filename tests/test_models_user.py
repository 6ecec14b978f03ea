"""A user's model (``package.module:function``) that cannot train is refused before any worker
starts: one line, exit code 2, nothing written; the probe leaves the model as it was."""
from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from conftest import one_line_error
from parascale.cli.main import main
from parascale.models import probe

MODELS = '''
from torch import nn

class Net(nn.Module):
    def __init__(self, num_classes, input_shape):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

class TwoInputs(Net):
    def forward(self, x, lengths):
        return self.body(x)

class AuxInTraining(Net):  # as torchvision's googlenet with aux_logits
    def forward(self, x):
        out = self.body(x)
        return (out, out) if self.training else out

class Detached(Net):
    def forward(self, x):
        return self.body(x).detach()

class BackwardFails(Net):
    def forward(self, x):
        return Explode.apply(self.body(x))

import torch

class Explode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("no backward here")
'''


@pytest.mark.parametrize("factory, words", [
    ("TwoInputs", "its forward must take one argument, a batch of inputs (N, C, H, W): "
                  "missing a required argument: 'lengths'"),
    ("AuxInTraining", "cannot be trained: in training mode the output is a tuple, not a tensor "
                      "of logits"),
    ("Detached", "cannot be trained: its output does not depend on a trainable parameter"),
    ("BackwardFails", "cannot be trained: a training step fails: no backward here"),
])
def test_a_user_model_that_cannot_train_is_one_line_before_any_worker(tmp_path, monkeypatch,
                                                                     capsys, factory, words):
    module = f"user_models_{factory.lower()}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(MODELS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    code = main(["train", "--workers", "1", "--dataset", "digits", "--steps", "1",
                 "--model", f"{module}:{factory}", "--out", str(out)])
    line = one_line_error(capsys)
    assert code == 2 and line.startswith(f"parascale: error: model '{module}:{factory}'"), line
    assert words in line, line
    assert not out.exists()


def test_the_training_probe_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5),
                          nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    model[1].eval()  # a part the caller froze
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    probe(model, (1, 8, 8), 10, step=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert [m.training for m in model] == [True, False, True, True, True, True]
    assert torch.equal(torch.get_rng_state(), rng)
