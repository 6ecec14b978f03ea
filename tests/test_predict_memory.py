"""``parascale predict --device-memory``: the ZeRO paper's bytes per parameter per stage, the
devices a model needs, from --params or a record's measured split; bad input in one line."""
from __future__ import annotations

import pytest

from conftest import one_line_error, record, write_study
from parascale.cli.main import main
from parascale.predict.memory import (MIXED_ADAM, PerParameter, devices_needed, per_device,
                                      sent_per_step)


@pytest.mark.parametrize("stage, bytes_per_parameter", [
    (0, lambda n: 16), (1, lambda n: 4 + 12 / n), (2, lambda n: 2 + 14 / n), (3, lambda n: 16 / n)])
@pytest.mark.parametrize("n", [1, 4, 64])
def test_the_papers_bytes_per_parameter(stage, bytes_per_parameter, n):
    assert per_device(stage, 1e9, n, MIXED_ADAM) == pytest.approx(bytes_per_parameter(n) * 1e9)


def test_stage_three_gathers_the_parameters_once_more():
    assert sent_per_step(0, 1e6, 4, MIXED_ADAM) == pytest.approx(2 * 3 / 4 * 2e6)
    assert sent_per_step(3, 1e6, 4, MIXED_ADAM) == pytest.approx(3 * 3 / 4 * 2e6)


def test_devices_needed_is_the_fewest_that_fit():
    gib = 2**30
    # 7.5e9 parameters: 120 GB replicated never fits 80 GiB; stage 3 needs ceil(120e9/80GiB) = 2
    assert devices_needed(0, 7.5e9, 80 * gib, MIXED_ADAM) is None
    assert devices_needed(3, 7.5e9, 80 * gib, MIXED_ADAM) == 2
    for stage in (1, 2, 3):
        n = devices_needed(stage, 7.5e9, 80 * gib, MIXED_ADAM, activations=gib)
        assert per_device(stage, 7.5e9, n, MIXED_ADAM, gib) <= 80 * gib
        assert n == 1 or per_device(stage, 7.5e9, n - 1, MIXED_ADAM, gib) > 80 * gib
    small = PerParameter(4, 4, 4, "fp32 SGD with momentum")
    assert devices_needed(0, 1e6, 80 * gib, small) == 1


def test_params_alone_answer_each_strategy(capsys):
    assert main(["predict", "--params", "7e9", "--device-memory", "80", "--workers", "1,8"]) == 0
    out = capsys.readouterr().out
    assert "replicated (--sync allreduce): never" in out
    assert "stage 3    (--sync fsdp --sync-option stage=3): 2" in out


def split(params: int, state: int, acts: int) -> dict:
    return {"parameter_count": params // 4, "parameters_bytes": params,
            "gradients_bytes": params, "optimizer_state_bytes": state,
            "activations_bytes": acts, "rest_bytes": 1}


def test_a_records_measured_split_gives_bytes_per_parameter(tmp_path, capsys):
    rec = record(2, 1000.0, sync="zero")
    # ZeRO on 2 workers: each holds half the momentum; the whole is their sum
    rec["memory"] = {"kind": "cpu_max_rss", "peak_bytes_per_rank": [1, 1],
                     "split_per_rank": [split(4000, 1600, 500), split(4000, 2400, 700)]}
    folder = write_study(tmp_path / "s", [rec])
    assert main(["predict", str(folder), "--device-memory", "1", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "1,000 parameters; 4 + 4 + 4 bytes per parameter" in out
    assert "activations 0.0 MiB" in out and "measured" in out


@pytest.mark.parametrize("args, message", [
    (["--device-memory", "8"], "--device-memory needs the model: --params N"),
    (["--params", "1e9", "--device-memory", "0"], "--device-memory must be a positive number"),
    (["--params", "1e9", "--device-memory", "nan"], "--device-memory must be a positive number"),
    ([], "predict needs a study folder"),
    # the limits the scaling prediction keeps (predict/limits.py)
    (["--params", "7e9", "--device-memory", "80", "--workers", "0"],
     "--workers 0: worker counts must be positive integers up to 10,000,000"),
    (["--params", "7e9", "--device-memory", "80", "--workers", "1,20000000"],
     "--workers 1,20000000: worker counts must be positive integers up to 10,000,000"),
    (["--params", "1e15", "--device-memory", "80"],
     "--params must be a parameter count from 1 to 2.5e+14, got 1e+15"),
    (["--params", "7e9", "--device-memory", "1e-300"],
     "--device-memory must be a positive number of GiB from 0.001 to 1e+06, got 1e-300"),
    (["--params", "7e9", "--device-memory", "1e300"],
     "--device-memory must be a positive number of GiB from 0.001 to 1e+06, got 1e+300"),
])
def test_bad_input_is_one_line(args, message, capsys):
    assert main(["predict", *args]) == 2
    assert message in one_line_error(capsys)


def test_memory_alone_refuses_out_rather_than_ignore_it(tmp_path, capsys):
    out = tmp_path / "pred"
    assert main(["predict", "--params", "7e9", "--device-memory", "80", "--out", str(out)]) == 2
    assert "--out: predict --device-memory prints its answer and writes no file" in \
        one_line_error(capsys)
    assert not out.exists()


def test_a_record_without_a_split_is_one_line(tmp_path, capsys):
    folder = write_study(tmp_path / "s", [record(1, 1000.0)])
    assert main(["predict", str(folder), "--device-memory", "8"]) == 2
    assert "no finished record with a memory split" in one_line_error(capsys)
