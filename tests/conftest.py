"""Shared helpers: real training runs through the public API, read back from their files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


def run_training(out: Path, expect: str | None = "ok",
                 **options) -> tuple[dict, dict[str, torch.Tensor] | None]:
    """Run ``parascale.train`` into ``out``; return the record and the saved parameters.

    ``expect`` is the status the run must end with (its reason is shown when it does not).
    """
    import parascale

    options.setdefault("dataset", "digits")
    options.setdefault("model", "smallcnn")
    options.setdefault("timeout", 60.0)
    record = parascale.train({**options, "out": str(out)})
    if expect is not None:
        assert record["status"] == expect, record["reason"]
    on_disk = json.loads((out / "record.json").read_text())
    assert on_disk == record
    model = out / "model.pt"
    state = torch.load(model, map_location="cpu") if model.exists() else None
    return record, state


@pytest.fixture
def train_run(tmp_path):
    counter = iter(range(1000))

    def run(**options):
        return run_training(tmp_path / f"run{next(counter)}", **options)

    return run
