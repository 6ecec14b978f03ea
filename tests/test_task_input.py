"""A user's task that is wrong in any way is one line naming the call and what was expected,
exit code 2, before any worker starts, with nothing written."""
import textwrap

import pytest

from parascale.cli.main import main

GOOD = """
import torch
from torch import nn
from parascale.tasks import Metric, Task

class Points(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(n)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}

def mse(net, batch):
    return nn.functional.mse_loss(net(batch["x"]), batch["y"])

def mae(net, batch):
    return (net(batch["x"]) - batch["y"]).abs().mean()

def make(**changes):
    fields = dict(train_data=Points(64), eval_data=Points(16), model=lambda: nn.Linear(4, 1),
                  loss=mse, metrics=[Metric("mae", mae, False)])
    fields.update(changes)
    return Task(**fields)

def good():
    return make()
"""

BAD = {
    "raises": ("def task():\n    raise RuntimeError('no data here')",
               ["task()", "raised RuntimeError: no data here"]),
    "wrong_type": ("def task():\n    return {'model': 1}", ["returned a dict", "Task"]),
    "not_batchable": ("class Ragged(Points):\n    def __getitem__(self, i):\n"
                      "        return {'x': torch.zeros(i + 1), 'y': self.y[i]}\n"
                      "def task():\n    return make(train_data=Ragged(8))",
                      ["train_data cannot be batched", "collate"]),
    "loss_not_scalar": ("def task():\n    return make(loss=lambda net, b: (net(b['x']) - "
                        "b['y']) ** 2)", ["loss(model, batch)", "shape (2, 1)", "scalar"]),
    "loss_not_finite": ("def task():\n    return make(loss=lambda net, b: net(b['x']).sum() "
                        "* float('nan'))", ["nan", "finite"]),
    "no_direction": ("def task():\n    return make(metrics=[Metric('mae', mae)])",
                     ["metric 'mae' has no direction", "higher_is_better"]),
    "metric_raises": ("def task():\n    return make(metrics=[Metric('r2', lambda n, b: "
                      "b['z'], True)])", ["metric 'r2' raised KeyError"]),
    "bad_judge": ("def task():\n    return make(judge='accuracy')",
                  ["judge 'accuracy'", "loss, mae"]),
    "not_a_dataset": ("def task():\n    return make(eval_data=3)",
                      ["eval_data is a int", "Dataset"]),
    # sys.exit in the user's code during the check: a usage error, not a silent exit 0 or 5
    "model_exits": ("import sys\ndef task():\n    return make(model=lambda: sys.exit(0))",
                    ["model() exited (SystemExit(0))", "usertask_model_exits.py:"]),
    "loss_exits": ("import sys\ndef task():\n    return make(loss=lambda net, b: sys.exit(5))",
                   ["loss(model, batch) exited (SystemExit(5))"]),
    "metric_exits": ("import sys\ndef task():\n    return make(metrics=[Metric('r2', lambda n, "
                     "b: sys.exit(), True)])", ["metric 'r2' exited (SystemExit(None))"]),
    "collate_exits": ("import sys\ndef task():\n    return make(collate=lambda items: "
                      "sys.exit('no'))", ["train_data", "exited (SystemExit('no'))"]),
    # each of these was a traceback (or DDP's error on 2 workers) after the check passed
    "len_raises": ("class NoLen(Points):\n    def __len__(self):\n        raise RuntimeError("
                   "'no len')\ndef task():\n    return make(train_data=NoLen(8))",
                   ["train_data: len() raised RuntimeError: no len", "number of samples"]),
    "len_not_int": ("class TextLen(Points):\n    def __len__(self):\n        return '3'\n"
                    "def task():\n    return make(eval_data=TextLen(8))",
                    ["eval_data: len() raised TypeError", "number of samples"]),
    "len_negative": ("class Negative(Points):\n    def __len__(self):\n        return -1\n"
                     "def task():\n    return make(train_data=Negative(8))",
                     ["train_data: len() raised ValueError", "number of samples"]),
    "backward_raises": ("class Broken(torch.autograd.Function):\n"
                        "    @staticmethod\n    def forward(ctx, x):\n        return x.clone()\n"
                        "    @staticmethod\n    def backward(ctx, g):\n"
                        "        raise RuntimeError('backward boom')\n"
                        "def task():\n    return make(loss=lambda n, b: Broken.apply(mse(n, b)))",
                        ["the backward of loss(model, batch) raised RuntimeError: backward boom"]),
    "loss_complex": ("def task():\n    return make(loss=lambda n, b: mse(n, b) * (1 + 1j))",
                     ["loss(model, batch) returned a complex", "real"]),
    "loss_shape_1_1": ("def task():\n    return make(loss=lambda n, b: mse(n, b).reshape(1, 1))",
                       ["loss(model, batch) returned a tensor of shape (1, 1)", "shape ()"]),
    "metric_huge_int": ("def task():\n    return make(metrics=[Metric('count', lambda n, b: "
                        "10 ** 400, False)])", ["metric 'count' returned an int too large"]),
    "optimizer_raises": ("def no(params, lr):\n    raise ValueError('opt boom')\n"
                         "def task():\n    return make(optimizer=no)",
                         ["optimizer(params, lr) raised ValueError: opt boom"]),
    "optimizer_wrong": ("def task():\n    return make(optimizer=lambda params, lr: 3)",
                        ["optimizer(params, lr) returned a int", "torch.optim.Optimizer"]),
    "unused_parameters": ("class Two(nn.Module):\n    def __init__(self):\n"
                          "        super().__init__()\n        self.a, self.b = nn.Linear(4, 1), "
                          "nn.Linear(4, 1)\n    def forward(self, x):\n        return self.a(x)\n"
                          "def task():\n    return make(model=Two)",
                          ["b.weight, b.bias", "no gradient", "requires_grad"]),
    "model_an_instance": ("def task():\n    return make(model=nn.Sequential(nn.Linear(4, 1)))",
                          ["model is a Sequential module", "a function that returns",
                           "model=lambda: nn.Sequential(...)"]),
    "loss_a_module": ("def task():\n    return make(loss=nn.MSELoss())",
                      ["loss is a MSELoss module", "loss(model, batch)"]),
    # names reach the console, the log, the record and reports: short printable text only
    "name_number": ("def task():\n    return make(name=123)", ["name 123", "is a int", "text"]),
    "name_huge": ("def task():\n    return make(name='x' * 20000)",
                  ["name 'xxxx", "20000 characters", "1 to 64 printable characters"]),
    "name_newline": ("def task():\n    return make(name='two\\nlines')",
                     ["name 'two\\nlines'", "control character", "printable"]),
    "name_escape": ("def task():\n    return make(name='\\x1b[31mred')",
                    ["name '\\x1b[31mred'", "control character"]),
    "name_blank": ("def task():\n    return make(name='   ')", ["name '   '", "empty"]),
    "unit_escape": ("def task():\n    return make(unit='s\\x1b[2J')",
                    ["unit 's\\x1b[2J'", "control character"]),
    "metric_huge": ("def task():\n    return make(metrics=[Metric('m' * 5000, mae, False)])",
                    ["metric name 'mmmm", "5000 characters"]),
    # the sample count is read from the batch's first tensor: here the class weights, not the
    # inputs, which inflated the train loss 125x
    "collate_counts_wrong": ("from torch.utils.data import default_collate\n"
                             "def weighted(items):\n"
                             "    return (torch.ones(10), default_collate(items))\n"
                             "def task():\n    return make(collate=weighted, loss=lambda n, b: "
                             "mse(n, b[1]), metrics=[])",
                             ["a batch of 3 items of train_data counts 10 samples", "first tensor"]),
}


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Writes usertask_<name>.py into a folder that is the working one (where --task looks)."""
    monkeypatch.chdir(tmp_path)

    def write(name: str, body: str) -> str:
        (tmp_path / f"usertask_{name}.py").write_text(GOOD + textwrap.dedent(body) + "\n")
        return f"usertask_{name}"

    return write


def refused(capsys, tmp_path, *args) -> str:
    out = tmp_path / "out"
    code = main(["train", *args, "--workers", "1", "--out", str(out)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("parascale: error:"), err
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_wrong_task_is_one_line_naming_the_call(capsys, tmp_path, module, case):
    body, words = BAD[case]
    name = module(case, body)
    line = refused(capsys, tmp_path, "--task", f"{name}:task")
    assert f"task '{name}:task'" in line and "\x1b" not in line and len(line) < 600
    for word in words:
        assert word in line, (word, line)


def test_a_task_that_cannot_be_imported_is_named(capsys, tmp_path, module):
    line = refused(capsys, tmp_path, "--task", "no_such_module:task")
    assert "task 'no_such_module:task'" in line and "not found" in line
    name = module("typo", "")
    line = refused(capsys, tmp_path, "--task", f"{name}:tsak")
    assert "has no attribute 'tsak'" in line


def test_a_target_on_a_metric_the_task_lacks_is_refused(capsys, tmp_path, module):
    name = module("target", "")
    line = refused(capsys, tmp_path, "--task", f"{name}:good", "--target-metric", "accuracy",
                   "--target-value", "0.9")
    assert "'accuracy' is not a metric of this task" in line and "loss, mae" in line
    line = refused(capsys, tmp_path, "--task", f"{name}:good", "--target-accuracy", "0.9")
    assert "'accuracy' is not a metric" in line


def test_target_metric_and_value_go_together(capsys, tmp_path):
    line = refused(capsys, tmp_path, "--target-metric", "loss")
    assert "--target-value" in line
    line = refused(capsys, tmp_path, "--target-metric", "perplexity", "--target-value", "3")
    assert "'perplexity' is not a metric of this task" in line


def test_the_optimizer_is_a_choice(capsys, tmp_path):
    code = main(["train", "--optimizer", "lion", "--out", str(tmp_path / "o")])
    assert code == 2 and "adamw" in capsys.readouterr().err


def test_a_search_objective_must_be_a_metric_of_the_task(capsys, tmp_path, module):
    name = module("objective", "")
    code = main(["hpo", "--task", f"{name}:good", "--objective", "perplexity", "--trials", "1",
                 "--param", "lr=0.01:0.1",
                 "--out", str(tmp_path / "h")])
    err = capsys.readouterr().err
    assert code == 2 and "--objective 'perplexity' is not a metric of this task" in err
    assert "loss, mae" in err and not (tmp_path / "h").exists()


def test_a_tasks_own_optimizer_is_refused_where_the_strategy_updates_itself(capsys, tmp_path,
                                                                            module):
    name = module("own_optimizer", "def task():\n    return make(optimizer=lambda params, lr: "
                                   "torch.optim.Adam(params, lr=lr))")
    line = refused(capsys, tmp_path, "--task", f"{name}:task", "--sync", "parameter-server")
    assert "brings its own optimizer" in line and "parameter-server" in line


def test_ctrl_c_in_the_tasks_code_during_the_check_still_interrupts(capsys, tmp_path, module):
    name = module("interrupted", "def stop():\n    raise KeyboardInterrupt\n"
                                 "def task():\n    return make(model=stop)")
    code = main(["train", "--task", f"{name}:task", "--workers", "1",
                 "--out", str(tmp_path / "out")])
    assert code == 130 and "parascale: interrupted" in capsys.readouterr().err


def test_the_name_rule_is_one_public_function():
    """What a task's name and unit and a metric's name may be, in one place that other callers
    (the script API's metric names) can use: 1 to 64 printable characters."""
    from parascale.tasks import NAME_CHARACTERS, name_problem

    for good in ("smallcnn on digits", "val-mae", "précision", "x" * NAME_CHARACTERS):
        assert name_problem(good) is None, good
    for bad, problem in ((None, "is a NoneType"), ("", "is empty"), (" \u3000", "is empty"),
                         ("x" * (NAME_CHARACTERS + 1), "has 65 characters"),
                         ("a\tb", "control character '\\t'"),
                         ("right\u202eto left", "control character '\\u202e'")):
        assert problem in (name_problem(bad) or ""), (bad, name_problem(bad))


@pytest.mark.parametrize("option", [["--model", "resnet20"], ["--dataset", "synthetic"],
                                    ["--image-size", "64"], ["--data-dir", "data"],
                                    ["--augment"], ["--context", "32"], ["--num-classes", "3"]])
def test_a_model_or_data_option_beside_a_task_is_refused(capsys, tmp_path, module, option):
    """The task brings its own model and data: the option would be ignored while the record
    said it (``model: resnet20``)."""
    name = module("beside", "")
    line = refused(capsys, tmp_path, "--task", f"{name}:good", *option)
    assert f"{option[0]} does not apply" in line and "--task" in line and "leave" in line


def test_a_model_beside_a_task_is_refused_from_the_python_api_too():
    from parascale.errors import UsageError
    from parascale.training import train

    with pytest.raises(UsageError, match="--model does not apply"):
        train({"task": "regression:task", "model": "resnet20", "workers": 1})


def test_predict_counts_no_model_for_a_tasks_record():
    """A task's record holds the default model and dataset fields (unused): predict must not
    count smallcnn's parameters as the task's gradient."""
    from pathlib import Path

    from conftest import record
    from parascale.predict import gradient
    from parascale.report.load import RunRecord

    data = record(1, 100.0)
    assert gradient.counted(RunRecord(Path("record.json"), "", data)) is not None  # smallcnn
    data["config"]["task"] = "regression:task"
    assert gradient.counted(RunRecord(Path("record.json"), "", data)) is None


def _hpo_refused(capsys, tmp_path, name: str, *args) -> str:
    code = main(["hpo", "--task", f"{name}:good", "--trials", "1", "--param", "lr=0.01:0.1",
                 *args, "--out", str(tmp_path / "h")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (tmp_path / "h").exists(), err
    return err[0]


def test_a_search_without_objective_on_a_task_without_accuracy_says_so(capsys, tmp_path,
                                                                       module):
    name = module("no_objective", "")
    line = _hpo_refused(capsys, tmp_path, name)
    assert "is not a metric" not in line  # no --objective 'accuracy' was given
    assert "this task has no metric 'accuracy'" in line and "loss, mae" in line
    assert "--objective mae" in line


def test_a_time_to_accuracy_search_on_a_task_without_accuracy_blames_the_objective(
        capsys, tmp_path, module):
    name = module("tta", "")
    line = _hpo_refused(capsys, tmp_path, name, "--objective", "tta", "--target", "0.9")
    assert "lr" not in line.split("error:", 1)[1]  # the range is not what is wrong
    assert "--objective tta" in line and "no metric 'accuracy'" in line and "loss, mae" in line


def test_a_validation_fraction_that_leaves_nothing_to_train_says_the_counts(capsys, tmp_path,
                                                                            module):
    name = module("tiny", "def task():\n    return make(train_data=Points(4))")
    line = refused(capsys, tmp_path, "--task", f"{name}:task", "--val-fraction", "0.9")
    assert "cannot be batched" not in line
    assert "--val-fraction 0.9 holds out 4 of the 4 samples of train_data" in line
    assert "0 to train on" in line and "smaller --val-fraction" in line


def test_a_setting_every_trial_would_refuse_is_not_blamed_on_a_searched_range(capsys, tmp_path,
                                                                              module):
    name = module("fixed_wrong", "")
    line = _hpo_refused(capsys, tmp_path, name, "--objective", "mae", "--target-metric",
                        "perplexity", "--target-value", "3")
    assert line.startswith("parascale: error: --target-metric 'perplexity' is not a metric")
