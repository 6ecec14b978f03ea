"""Joining a world made by torchrun: two agents on loopback act as two nodes of one job."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from conftest import run_training

pytestmark = pytest.mark.slow  # every test here starts worker processes

ARGS = ["--model", "smallcnn", "--dataset", "digits", "--global-batch", "32", "--steps", "5",
        "--lr", "0.1", "--seed", "5", "--timeout", "60"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_train_like_a_local_two_worker_job(tmp_path):
    port, out = free_port(), tmp_path / "torchrun"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("PARASCALE_FAULT", None)
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "parascale", "train", *ARGS, "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)]
    outputs = [agent.communicate(timeout=240)[0] for agent in agents]
    assert [a.returncode for a in agents] == [0, 0], outputs
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "ok"
    assert record["environment"]["launcher"] == "torchrun"
    assert record["derived"]["world_size"] == 2 and record["derived"]["per_device_batch"] == 16
    assert "parascale: smallcnn on digits" in outputs[0]  # rank 0 speaks...
    assert "parascale: smallcnn on digits" not in outputs[1]  # ...and only rank 0

    _, local = run_training(tmp_path / "local", workers=2, global_batch=32, steps=5, lr=0.1,
                            seed=5)
    joined = torch.load(out / "model.pt")
    for name in local:
        torch.testing.assert_close(joined[name], local[name], atol=1e-6, rtol=1e-5)
