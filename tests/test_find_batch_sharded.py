"""``find-batch --sync zero|fsdp``: each probe trains on 2 workers with the strategy, so the
largest batch reflects its memory layout; bad input is one line (exit 2) before any probe."""
from __future__ import annotations

import json
import textwrap

import pytest

from conftest import one_line_error
from parascale.cli.main import main

# 2048 wide, 6 deep: 25 M parameters, 100 MiB each of parameters, gradients and momentum, so
# ZeRO-1 on 2 workers holds 50 MiB less than allreduce, FSDP about 200 MiB less
WIDE = """
    from torch import nn

    def wide(num_classes, input_shape):
        c, h, w = input_shape
        layers = [nn.Flatten(), nn.Linear(c * h * w, 2048), nn.ReLU()]
        for _ in range(6):
            layers += [nn.Linear(2048, 2048), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(2048, num_classes))
"""


def search(tmp_path, sync: str, budget: str, max_batch: int, *extra: str) -> tuple[int, dict]:
    out = tmp_path / f"{sync}.json"
    code = main(["find-batch", "--model", "wide_model:wide", "--dataset", "digits",
                 "--sync", sync, "--workers", "2", "--memory-limit", budget,
                 "--max-batch", str(max_batch), "--out", str(out), *extra])
    return code, json.loads(out.read_text()) if code == 0 else {}


@pytest.mark.slow
def test_sharded_layouts_fit_a_batch_where_allreduce_fits_none(tmp_path, monkeypatch):
    (tmp_path / "wide_model.py").write_text(textwrap.dedent(WIDE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # allreduce's and ZeRO's peaks at batch 1, under a budget nothing reaches
    peak = {sync: search(tmp_path, sync, "64G", 1)[1]["peak_bytes"]
            for sync in ("allreduce", "zero")}
    assert peak["zero"] < peak["allreduce"], peak
    # a budget between the two: allreduce fits no batch, FSDP (holding less than ZeRO) does
    budget = f"{(peak['allreduce'] + peak['zero']) // 2}"
    assert search(tmp_path, "allreduce", budget, 2)[0] == 1
    code, fsdp = search(tmp_path, "fsdp", budget, 2, "--sync-option", "stage=3")
    assert code == 0 and fsdp["batch"] == 2 and fsdp["workers"] == 2
    assert all(p["fits"] and p["peak_bytes"] <= int(budget) for p in fsdp["probes"])


BASE = ["find-batch", "--model", "mlp", "--dataset", "digits"]


@pytest.mark.parametrize("args, words", [
    (["--workers", "2"], "--workers belongs to a search under a strategy; give --sync"),
    (["--sync-option", "stage=2"], "--sync-option belongs to a search under a strategy"),
    (["--gpus", "0,1"], "two --gpus belongs to a search under a strategy"),
    (["--sync", "fsdp", "--workers", "1"], "needs 2 or more workers, got 1"),
    (["--sync", "zero", "--gpus", "0"], "needs 2 or more workers, got 1"),
    (["--sync", "zero", "--gpus", "0,1", "--workers", "2"], "leave out --workers"),
    (["--sync", "fsdp", "--sync-option", "stage=4"], "stage=4: FSDP shards at stage 2 or 3"),
    (["--sync", "zero", "--sync-option", "stage=2"], "belongs to --sync fsdp"),
    (["--sync", "nope"], "unknown --sync 'nope'"),
    (["--sync", "fsdp", "--sync-option", "stage"], "KEY=VALUE"),
])
def test_bad_sharded_input_is_one_line(capsys, args, words):
    assert main([*BASE, *args]) == 2
    line = one_line_error(capsys)
    assert words in line, line
