"""Bad input: one clear line, exit code 2, nothing written, no traceback, before any worker."""
import os
import socket
import subprocess
import sys

import pytest

from parascale.cli.main import main


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
    (["--epochs", "two"], ["--epochs", "invalid"]),
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
