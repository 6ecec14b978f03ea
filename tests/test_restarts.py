"""A worker SIGKILLed in the middle of an epoch with restarts allowed: every worker starts again
from the newest checkpoint, the run finishes, and its parameters are those of a run that never
failed. Under torchrun, torchrun's own restarts are continued from the checkpoint too."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import run_training

pytestmark = pytest.mark.slow  # every test here starts worker processes

# 5 steps an epoch; checkpoints after steps 3 and 6; rank 1 dies before step 7 (epoch 2)
RUN = dict(workers=2, global_batch=256, steps=8, lr=0.1, momentum=0.9, weight_decay=1e-4,
           seed=3, timeout=30.0)


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    """The parameters of the run that never failed."""
    _, state = run_training(tmp_path_factory.mktemp("whole"), **RUN)
    return state


def test_a_killed_worker_is_restarted_from_the_checkpoint_and_the_run_is_exact(
        tmp_path, monkeypatch, expected):
    monkeypatch.setenv("PARASCALE_FAULT", "kill@1:7")  # the first attempt only
    record, state = run_training(tmp_path / "run", checkpoint_every=3, max_restarts=1, **RUN)
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    (restart,) = record["restarts"]
    assert restart["rank"] == 1 and restart["attempt"] == 1
    assert restart["reason"] == "rank 1 was killed by SIGKILL"
    assert (restart["from_step"], restart["checkpoint"]) == (6, "checkpoints/step-00000006.pt")
    assert restart["at"] <= record["resumed"][0]["at"]
    assert record["resumed"][0]["by"] == "restart" and record["resumed"][0]["rank"] == 1
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "rank 1 was killed by SIGKILL; restarting every worker from " \
           "checkpoints/step-00000006.pt (restart 1 of 1)" in log
    assert log.rstrip().splitlines()[-1].startswith("parascale: finished at ")
    assert log.rstrip().endswith("after 1 restart(s)")


def test_restarts_end_when_the_fault_comes_back_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv("PARASCALE_FAULT", "kill@1:5/*")  # every attempt: no restart can help
    record, state = run_training(tmp_path / "run", expect="failed", checkpoint_every=3,
                                 max_restarts=1, **RUN)
    assert state is None and record["reason"].startswith("rank 1 was killed by SIGKILL")
    assert [(r["attempt"], r["rank"], r["from_step"]) for r in record["restarts"]] == \
        [(1, 1, 3)]
    log = (tmp_path / "run" / "log.txt").read_text()
    assert log.count("parascale: 2 worker(s) joined") == 2
    assert "parascale: failed at " in log.rstrip().splitlines()[-1]


def test_torchrun_restarts_continue_from_the_checkpoint(tmp_path, expected):
    out = tmp_path / "torchrun"
    # torchrun as users start it: sharing its rendezvous store with the workers, across restarts
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    env.update(GLOO_SOCKET_IFNAME="lo", PARASCALE_FAULT="kill@1:7")
    args = [f"--{k.replace('_', '-')}={v}" for k, v in RUN.items() if k != "workers"]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "1", "-m", "parascale", "train", *args, "--checkpoint-every", "3",
         "--out", str(out)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((out / "record.json").read_text())
    assert record["environment"]["launcher"] == "torchrun"
    assert record["resumed"][0]["by"] == "torchrun" and record["resumed"][0]["step"] == 6
    assert record["restarts"][0]["attempt"] == 1 and record["restarts"][0]["from_step"] == 6
    state = torch.load(out / "model.pt")
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    log = (out / "log.txt").read_text()
    assert "attempt 0" in log and "attempt 1" in log and "torchrun's restart 1" in log
