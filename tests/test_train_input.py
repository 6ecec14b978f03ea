"""Bad input: one clear line, exit code 2, nothing written, no traceback, before any worker."""
import os
import socket
import subprocess
import sys

import pytest

from helpers import OVERSUBSCRIPTION, one_error_line
from parascale.cli.main import main
from parascale.config import TrainConfig
from parascale.runtime.env import available_cores


def run_cli(capsys, *args):
    code = main(["train", *args])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("args, words", [
    (["--model", "resnet2"], ["unknown", "resnet20"]),
    (["--dataset", "cifar100"], ["cifar10", "digits"]),
    (["--dataset", "cifar10"], ["data-dir"]),
    (["--dataset", "mnist", "--data-dir", "/nonexistent/folder"], ["/nonexistent/folder"]),
    (["--batch-size", "0"], ["--batch-size", "positive"]),
    (["--epochs", "-1"], ["--epochs", "positive"]),
    (["--batch-size", "8", "--global-batch", "16"], ["not both"]),
    (["--workers", "3", "--global-batch", "32"], ["does not divide", "3 workers"]),
    (["--workers", "2", "--global-batch", "4096"], ["larger than", "1437"]),
    (["--gpus", "0,1"], ["CUDA"]),
    (["--backend", "nccl", "--workers", "2"], ["nccl", "CUDA"]),
    (["--sync", "ring"], ["--sync", "allreduce"]),
    (["--lr-schedule", "step"], ["--lr-milestones"]),
    (["--epochs", "two"], ["--epochs", "expected a whole number"]),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(capsys, tmp_path, args, words):
    out = tmp_path / "out"
    code, err = run_cli(capsys, *args, "--out", str(out))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parascale: error:"), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()


def test_busy_port_is_a_usage_error(capsys, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run_cli(capsys, "--workers", "1", "--port", str(port),
                            "--out", str(tmp_path / "out"))
    assert code == 2 and f"--port {port} is already in use" in err
    assert not (tmp_path / "out" / "record.json").exists()


@pytest.mark.slow
def test_no_traceback_from_the_real_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "parascale", "train", "--model", "nope",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          env={**os.environ}, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_more_workers_than_the_data_says_the_numbers(capsys, tmp_path):
    assert main(["train", "--workers", "10000", "--out", str(tmp_path / "run")]) == 2
    line = one_error_line(capsys)
    assert "10000 workers x batch 32 need 320000 training samples per step; digits has 1437: " \
           "use at most 44 workers at batch 32" in line, line
    assert not (tmp_path / "run").exists()


def test_oversubscription_is_refused_with_the_numbers_unless_insisted():
    from parascale.errors import UsageError
    from parascale.training import preflight

    cores = available_cores()
    many = OVERSUBSCRIPTION * cores + 1
    with pytest.raises(UsageError) as refused:
        preflight(TrainConfig.of(workers=many, batch_size=1), many)
    assert f"{many} CPU threads ({many} workers x 1 threads) on {cores} cores" in str(refused.value)
    assert "--oversubscribe" in str(refused.value)
    with pytest.raises(UsageError) as threads:
        preflight(TrainConfig.of(workers=2, threads=100000), 2)
    assert "200000 CPU threads (2 workers x 100000 threads)" in str(threads.value)
    preflight(TrainConfig.of(workers=many, batch_size=1, oversubscribe=True), many)
    # what the suite runs: 4 workers and 2 parameter servers on 2 cores
    preflight(TrainConfig.of(workers=2 * cores, global_batch=32, sync="parameter-server",
                             sync_options={"ps_servers": 2}), 2 * cores)
