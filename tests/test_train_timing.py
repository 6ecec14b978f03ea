"""One run's figures: partial and single epochs timed per step and said so, the command's whole
wall time, and step progress on a terminal."""

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from helpers import SMALL, train_here


def cli_train(out, *args, **popen):
    """``parascale train`` as a user runs it; returns (completed process, record)."""
    proc = subprocess.run([sys.executable, "-m", "parascale", "train", *SMALL, *args,
                           "--out", str(out)], capture_output=True, text=True, timeout=300,
                          **popen)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads((out / "record.json").read_text())


def assert_steady_from_steps(proc, record, source):
    """No full epoch after the warm-up: the steady step time x steps per epoch, and it says so."""
    summary, derived = record["summary"], record["derived"]
    assert summary["steady_epoch_time_method"] == "steps"
    assert summary["steady_source"] == source
    # a full epoch at the steady rate: its time x the throughput is a full epoch's samples
    assert summary["steady_epoch_time_s"] * summary["steady_throughput"] == \
        pytest.approx(derived["steps_per_epoch"] * derived["global_batch"])
    assert f"steady figures from {source}" in proc.out


@pytest.mark.slow
def test_a_partial_epoch_is_timed_per_step_and_never_passed_off_as_an_epoch(tmp_path, capfd):
    proc, record = train_here(tmp_path / "run", capfd, "--workers", "1", "--steps", "30")
    first, last = record["epochs"]
    assert (first["steps"], first["partial"]) == (22, False)
    assert (last["steps"], last["partial"]) == (8, True)
    assert "epoch 2/2 (partial, 8 of 22 steps):" in proc.out
    assert_steady_from_steps(proc, record, "steps 23-30 (the partial epoch 2)")


@pytest.mark.slow
def test_one_epoch_gives_steady_figures_from_its_later_steps_and_says_so(tmp_path, capfd):
    proc, record = train_here(tmp_path / "run", capfd, "--workers", "1", "--epochs", "1")
    assert record["steps"]["excluded"] == "first 2 steps of the only epoch"
    assert record["steps"]["count"] == 20
    assert_steady_from_steps(proc, record, "steps 3-22 of the only epoch")


@pytest.mark.slow
def test_full_steady_epochs_give_the_median_and_a_trailing_partial_one_is_left_out(tmp_path,
                                                                                  capfd):
    _, record = train_here(tmp_path / "run", capfd, "--workers", "1", "--steps", "70")
    assert [e["partial"] for e in record["epochs"]] == [False, False, False, True]
    summary = record["summary"]
    assert summary["steady_epoch_time_method"] == "epochs"
    assert summary["steady_source"] == "epochs 2-3"
    second, third = (e["wall_time_s"] for e in record["epochs"][1:3])
    assert summary["steady_epoch_time_s"] == pytest.approx((second + third) / 2)  # their median


@pytest.mark.slow
def test_the_command_reports_its_whole_wall_time_and_what_it_does_while_starting(tmp_path):
    began = time.time()
    proc, record = cli_train(tmp_path / "run", "--workers", "2", "--steps", "5")
    ended = time.time()
    timing = record["timing"]
    assert timing["since"] == "process start"
    # the command's time holds start-up and training, and the test saw it all happen
    assert 0 < timing["startup_s"] < timing["command_s"] <= ended - began
    assert timing["training_s"] == pytest.approx(record["summary"]["total_time_s"])
    assert timing["startup_s"] + timing["training_s"] <= timing["command_s"]
    lines = proc.stdout.splitlines()
    checking = lines.index("parascale: checking the configuration and data...")
    starting = lines.index("parascale: starting 2 workers...")
    banner = next(i for i, line in enumerate(lines) if line.startswith("parascale: mlp on"))
    assert checking < starting < banner
    done = next(line for line in lines if line.startswith("done in "))
    assert done.startswith(f"done in {timing['command_s']:.1f} s (start-up "
                           f"{timing['startup_s']:.1f} s, training {timing['training_s']:.1f} s)")


def _read_terminal(argv, env):
    """Run ``argv`` on a pseudo-terminal of 120 columns; everything it showed there."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                            close_fds=True)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed: the command ended
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(master)
    assert proc.returncode == 0, shown.decode(errors="replace")
    return shown.decode(errors="replace")


@pytest.mark.slow
def test_a_terminal_shows_step_progress_within_each_epoch(tmp_path):
    shown = _read_terminal([sys.executable, "-m", "parascale", "train", *SMALL, "--workers", "2",
                            "--epochs", "2", "--out", str(tmp_path / "run")], os.environ.copy())
    for epoch in (1, 2):
        assert re.search(rf"epoch {epoch}/2:\s+\d+%\|[^|\r\n]*\|\s*\d+/22 ", shown), shown
    # and each evaluation's, over rank 0's share of the test set's batches (none in the log)
    assert re.search(r"evaluating test:\s+\d+%\|[^|\r\n]*\|\s*\d+/1 ", shown), shown
    assert "evaluating" not in (tmp_path / "run" / "log.txt").read_text()
