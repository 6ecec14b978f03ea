"""--lr beyond any learning rate that trains (finite, yet the optimizer's update overflows in
every worker) is refused in validation: one line naming the range, exit code 2, nothing
written, no worker started."""
from __future__ import annotations

import pytest

import parascale
from conftest import one_line_error
from parascale.cli.main import main
from parascale.errors import UsageError


@pytest.mark.parametrize("lr", ["1e300", "1e7", "10000.5", "1e-300"])
def test_an_lr_beyond_the_range_is_one_line(tmp_path, capsys, lr):
    out = tmp_path / "run"
    code = main(["train", "--workers", "1", "--dataset", "digits", "--model", "mlp",
                 "--steps", "1", "--lr", lr, "--out", str(out)])
    line = one_line_error(capsys)
    assert code == 2 and "--lr must be in [1e-10, 10000]" in line, line
    assert f"got {float(lr):g}" in line
    assert not out.exists()


def test_the_api_refuses_it_too():
    with pytest.raises(UsageError, match=r"--lr must be in \[1e-10, 10000\]"):
        parascale.train({"model": "mlp", "dataset": "digits", "workers": 1, "lr": 1e300})


def test_the_ends_of_the_range_are_taken():
    from parascale.config import TrainConfig

    TrainConfig.of(lr=1e4).validate()
    TrainConfig.of(lr=1e-10).validate()
