"""torchrun across nodes that are really apart: each node a network namespace with its own
address and host name (.ci/nodes.py), so the rendezvous, gloo and a cut link run as they do
between machines, not over one shared loopback."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import assert_same, run_training, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

ARGS = ["--model", "smallcnn", "--dataset", "digits", "--global-batch", "32", "--lr", "0.1",
        "--seed", "5"]
PORT = "29500"  # every set of nodes has its own network: no other job can hold it


def torchrun(nodes, per_node: int, args: list[str], fault: str = "",
             restarts: int = 0) -> list[subprocess.Popen]:
    """One torchrun agent per node, rank 0's node hosting the rendezvous, as on a cluster."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PARASCALE_FAULT", "GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT")}
    if fault:
        env["PARASCALE_FAULT"] = fault
    return [nodes.popen(n.index, [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(nodes.nodes)),
        "--nproc-per-node", str(per_node), "--node-rank", str(n.index),
        "--master-addr", nodes.nodes[0].host, "--master-port", PORT,
        "--max-restarts", str(restarts), "-m", "parascale", "train", *ARGS, *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for n in nodes.nodes]


def finish(agents, within_s: float = 600) -> list[str]:
    return [agent.communicate(timeout=within_s)[0] for agent in agents]


def not_torchruns(output: str) -> int:
    """Tracebacks in an agent's output other than torchrun's own exit-barrier race: the agent
    hosting the store may leave the barrier and close the store while the last agent's wait is
    still in flight; torch logs that with its traceback and exits 0 (elastic/agent/server/api.py,
    _exit_barrier), after every worker has finished."""
    return output.count("Traceback") - output.count("Error waiting on exit barrier")


@pytest.mark.parametrize("per_node", [1, 2])
def test_two_nodes_train_to_the_parameters_of_one_process(tmp_path, multinode, per_node):
    nodes = multinode(2)
    out = tmp_path / "joined"
    outputs = finish(torchrun(nodes, per_node, ["--steps", "5", "--timeout", "60",
                                                "--out", str(out)]))
    assert not any(not_torchruns(o) for o in outputs), outputs
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "ok"
    assert record["derived"]["world_size"] == 2 * per_node
    assert "parascale: smallcnn on digits" in outputs[0]  # rank 0 speaks, on node0...
    assert "parascale: smallcnn on digits" not in outputs[1]  # ...and node1 is silent

    _, one = run_training(tmp_path / "one", workers=1, global_batch=32, steps=5, lr=0.1, seed=5)
    assert_same(torch.load(out / "model.pt"), one)


def test_workers_listen_only_on_their_nodes_address(tmp_path, multinode):
    nodes = multinode(2)
    # rank 1 stops before step 3, so that the world stays up while we look (the fixture ends it)
    agents = torchrun(nodes, 1, ["--steps", "5", "--timeout", "600", "--out", str(tmp_path)],
                      fault="hang@1:3")

    def workers_listening():
        # torchrun's agent calls itself pt_elastic; what it starts (parascale) is python
        found = {n.index: [a for a, who in nodes.listening(n.index) if "pt_elastic" not in who]
                 for n in nodes.nodes}
        return found if all(found.values()) else None

    found = wait_until(workers_listening, timeout_s=300)
    assert found, "the workers of both nodes did not start listening within 300 s"
    for n in nodes.nodes:
        assert all(a.rsplit(":", 1)[0] == n.address for a in found[n.index]), (n, found)
    for agent in agents:
        agent.kill()


def test_a_cut_link_ends_the_job_naming_the_rank_and_the_node(tmp_path, multinode):
    nodes = multinode(2)
    out, timeout = tmp_path / "cut", 20
    agents = torchrun(nodes, 1, ["--steps", "200", "--timeout", str(timeout),
                                 "--checkpoint-every", "5", "--out", str(out)])
    wait_until(lambda: (out / "checkpoints" / "step-00000005.pt").exists(), timeout_s=300)
    nodes.cut(1)
    cut_at = time.monotonic()
    outputs = finish(agents, within_s=timeout + 120)
    took = time.monotonic() - cut_at
    assert [a.returncode for a in agents] == [1, 1]
    # each agent names its failed rank and its node (host name from the node's own UTS)
    assert "host      : node1" in outputs[1] and "rank      : 1" in outputs[1], outputs[1]
    assert "host      : node0" in outputs[0] and "rank      : 0" in outputs[0], outputs[0]
    assert "a peer having failed" in (out / "log.txt").read_text()
    print(f"the job ended {took:.1f} s after the cut (--timeout {timeout})")


def test_after_a_cut_link_is_mended_restarts_finish_like_an_unbroken_run(tmp_path, multinode):
    nodes = multinode(2)
    out = tmp_path / "mended"
    agents = torchrun(nodes, 1, ["--steps", "30", "--timeout", "20", "--checkpoint-every", "5",
                                 "--out", str(out)], restarts=1)
    wait_until(lambda: (out / "checkpoints" / "step-00000005.pt").exists(), timeout_s=300)
    nodes.cut(1)
    log = out / "log.txt"
    assert wait_until(lambda: "a peer having failed" in log.read_text(), timeout_s=300)
    nodes.mend(1)
    outputs = finish(agents)
    assert [a.returncode for a in agents] == [0, 0], outputs
    record = json.loads((out / "record.json").read_text())
    assert record["status"] == "ok" and record["resumed"][0]["by"] == "torchrun"

    _, one = run_training(tmp_path / "one", workers=1, global_batch=32, steps=30, lr=0.1, seed=5)
    assert_same(torch.load(out / "model.pt"), one)
