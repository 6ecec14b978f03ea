"""Every file parascale writes is strict JSON: a non-finite figure is null, with what it was
beside it (``nonfinite``), never ``NaN`` or ``Infinity``, which other languages' parsers refuse.

One test per way a run meets one: a task's metric that is non-finite only inside the workers,
a script that logs a NaN, and a --peak-tflops so large that the devices' peak overflows.
"""
from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

import parascale
from conftest import run_training
from parascale import safejson
from parascale.cli.main import main

SRC = Path(parascale.__file__).resolve().parent


def strict(path: Path) -> dict:
    """The file as a parser that knows only JSON reads it (Python's own takes NaN)."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON ({path.name})")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_non_finite_number_becomes_null_with_what_it_was_beside_it():
    given = {"mfu": math.inf, "loss": 0.5, "per_rank": [1.0, math.nan, [-math.inf]],
             "entries": [{"test_mae": math.nan}], "a/b": math.nan}
    text = safejson.dumps(given)
    assert strict_text(text) == {
        "mfu": None, "loss": 0.5, "per_rank": [1.0, None, [None]],
        "entries": [{"test_mae": None, "nonfinite": {"test_mae": "NaN"}}], "a/b": None,
        "nonfinite": {"mfu": "Infinity", "per_rank/1": "NaN", "per_rank/2/0": "-Infinity",
                      "a~1b": "NaN"}}  # a JSON Pointer: '/' in a key is written '~1'
    assert given["mfu"] == math.inf  # the caller's value is left as it was


def strict_text(text: str) -> dict:
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {text}"))


def test_a_document_without_non_finite_numbers_is_written_as_json_would():
    value = {"a": [1, 2.5, None, "x"], "b": {"c": True}, "t": (1, 2)}
    assert safejson.finite(value) is value  # nothing copied
    assert safejson.dumps(value, indent=2) == json.dumps(value, indent=2)


def test_a_non_finite_number_with_no_object_to_hold_its_reason_is_refused():
    with pytest.raises(ValueError):
        safejson.dumps([1.0, math.nan])
    with pytest.raises(ValueError):
        safejson.dumps(math.inf)


# json.dumps left where its text is neither a file nor handed to another process: keys that
# compare or identify configurations in memory, text shown to a person, a copy in memory
IN_MEMORY = {
    "training/launch/preflight.py": 2, "training/checkpoint/resume.py": 2, "report/series.py": 2,
    "data/handover.py": 1, "hpo/study.py": 2, "bench/study.py": 5, "bench/plan.py": 3,
    "bench/runner.py": 1, "bench/expr.py": 1,
    "predict/table.py": 1,  # prediction.json: written with allow_nan=False already
}


def test_every_json_writer_goes_through_the_strict_one():
    found: dict[str, int] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "safejson.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json":
                assert node.func.attr != "dump", f"{path}: json.dump writes a file"
                if node.func.attr == "dumps":
                    name = str(path.relative_to(SRC))
                    found[name] = found.get(name, 0) + 1
    assert found == IN_MEMORY


NAN_TASK = '''
import torch
import torch.distributed as dist
from torch import nn

from parascale.tasks import Metric, Task


def odd(net, batch):
    """Finite where the launcher tries the task, NaN in the workers."""
    return float("nan") if dist.is_initialized() else 0.0


def task():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    items = [{"x": x[i], "y": x[i].sum().reshape(1)} for i in range(64)]
    return Task(train_data=items, eval_data=items[:16], model=lambda: nn.Linear(4, 1),
                loss=lambda net, b: nn.functional.mse_loss(net(b["x"]), b["y"]),
                metrics=[Metric("odd", odd, higher_is_better=True)], judge="odd",
                name="nan metric")
'''


@pytest.mark.slow
def test_a_metric_that_is_nan_only_in_the_workers_is_null_in_the_record(tmp_path, monkeypatch):
    (tmp_path / "nan_task.py").write_text(NAN_TASK)
    monkeypatch.chdir(tmp_path)
    run_training(tmp_path / "run", task="nan_task:task", workers=2, global_batch=16, steps=4)
    record = strict(tmp_path / "run" / "record.json")
    last = record["epochs"][-1]
    assert last["test_odd"] is None and last["nonfinite"] == {"test_odd": "NaN"}
    assert last["test_loss"] is not None  # the finite figures beside it are kept
    final = record["summary"]["final_metrics"]
    assert final["test_odd"] is None and final["nonfinite"] == {"test_odd": "NaN"}


NAN_SCRIPT = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import parascale.script as ps

run = ps.start()
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
loader = run.shard(DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
net = nn.Linear(4, 1)
model, optimizer = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.01))
for xb, yb in loader:
    optimizer.zero_grad()
    run.backward(nn.functional.mse_loss(model(xb), yb))
    optimizer.step()
run.log(error=float("nan"), higher_is_better={"error": False})
'''


@pytest.mark.slow
def test_a_script_that_logs_nan_writes_null_with_the_reason(tmp_path, capfd):
    script = tmp_path / "nan_script.py"
    script.write_text(NAN_SCRIPT)
    out = tmp_path / "out"
    assert main(["run", "--workers", "2", "--timeout", "60", "--out", str(out),
                 str(script)]) == 0, capfd.readouterr().err
    record = strict(out / "record.json")
    (entry,) = record["epochs"]
    assert entry["test_error"] is None and entry["nonfinite"] == {"test_error": "NaN"}
    assert record["summary"]["final_metrics"]["nonfinite"] == {"test_error": "NaN"}


@pytest.mark.slow
def test_a_peak_that_overflows_leaves_the_record_strict_json(tmp_path):
    run_training(tmp_path / "run", workers=1, batch_size=32, steps=3, peak_tflops=1e308)
    record = strict(tmp_path / "run" / "record.json")
    flops = record["flops"]
    assert flops["peak_flops"] is None and flops["peak_flops_per_rank"] == [None]
    assert flops["nonfinite"] == {"peak_flops": "Infinity", "peak_flops_per_rank/0": "Infinity"}
    assert flops["flops_per_step"] > 0 and record["summary"]["mfu"] == 0.0
