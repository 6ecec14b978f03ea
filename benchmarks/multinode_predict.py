"""``parascale predict`` held to a real link: 2 nodes (network namespaces, .ci/nodes.py), each
pinned to one core of its own, joined by links capped at each rate; prints the table
recorded in benchmarks/RESULTS-multinode.md. Needs root.

Per cap: ``parascale comm`` across the two nodes (torchrun, 1 worker a node) measures the link;
per model, a 2-node training run (torchrun) is measured, and ``predict`` (weak scaling, N=2)
is made from two 1-worker records taken on node0 alone just before and just after it (A B A:
a drift in the rest of the machine's load meets both sides alike) and that cap's comm record.
Models: smallcnn (0.6 MB of gradient) and benchmarks/multinode_models.py's wide_mlp (16.6 MB).
After the 2-node run, the same two nodes train with ``--sync none`` (the contention baseline at
N = 2, marked as bench marks its own), and predict is made again with it.
Besides the error, each row splits the 2-node run's sync into its measured wait (record
``steps.work.wait_s``) and exchange, beside the model's terms, and gives the error that is
left on the 2-node run's own work (the model's wait and exchange terms alone).

    sudo .venv/bin/python benchmarks/multinode_predict.py [--caps 100,1000,0] [--steps 30] \
        [--keep DIR]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from parascale import predict
from parascale.predict import wait
from parascale.predict.model import expected_max

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).with_name("RESULTS-multinode.md")
MODELS = {"smallcnn": "smallcnn", "wide_mlp": "multinode_models:wide_mlp"}
COMM_SIZES = "4K,64K,1M,4M,16M"


def nodes_tool():
    spec = importlib.util.spec_from_file_location("parascale_ci_nodes", ROOT / ".ci" / "nodes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def env() -> dict[str, str]:
    paths = [str(ROOT / "src"), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]
    drop = ("PARASCALE_FAULT", "GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT")
    return {**{k: v for k, v in os.environ.items() if k not in drop},
            "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def on_nodes(nodes, argv: list[str]) -> None:
    """``argv`` (a parascale command) under torchrun, one agent and one worker per node, node i
    on core i: two machines of one core each."""
    agents = [nodes.popen(n.index, [
        "taskset", "-c", str(n.index), sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(n.index),
        "--master-addr", "node0", "--master-port", "29500", "-m", "parascale", *argv],
        env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for n in nodes.nodes]
    outputs = [a.communicate(timeout=1800)[0] for a in agents]
    if any(a.returncode for a in agents):
        raise SystemExit("a run across the nodes failed:\n" + "\n".join(outputs))


def train_args(model: str, steps: int, out: Path) -> list[str]:
    return ["train", "--model", MODELS[model], "--dataset", "digits", "--batch-size", "64",
            "--threads", "1", "--steps", str(steps), "--no-save-model", "--out", str(out)]


def one_node(nodes, model: str, steps: int, out: Path) -> dict:
    argv = ["taskset", "-c", "0", sys.executable, "-m", "parascale",
            *train_args(model, steps, out), "--workers", "1"]
    nodes.run(0, argv, env=env(), check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "record.json").read_text())


def as_baseline(folder: Path) -> None:
    """Mark a --sync none record as a contention baseline, as bench marks its own, so that
    predict takes its compute as the compute at N = 2."""
    path = folder / "record.json"
    data = json.loads(path.read_text())
    data["study"] = {**(data.get("study") or {}), "baseline": True}
    path.write_text(json.dumps(data))


def medians(comm: Path) -> Path:
    """A copy of the comm record without its means: the link as fitted before mean_s."""
    data = json.loads((comm / "comm.json").read_text())
    for row in data["results"]:
        row.pop("mean_s", None)
    out = comm.with_name(comm.name + "-median")
    out.mkdir(exist_ok=True)
    (out / "comm.json").write_text(json.dumps(data))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caps", default="100,1000,0", help="Mbit/s per link, 0 uncapped")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--keep", help="copy the records made into this folder")
    args = parser.parse_args()
    tool = nodes_tool()
    why = tool.unavailable()
    if why:
        print(f"multinode_predict: {why}", file=sys.stderr)
        return 2
    caps = [float(c) for c in args.caps.split(",")]
    work = Path(tempfile.mkdtemp(prefix="parascale-multinode-"))
    lines = ["| link cap | model | gradient | comm: 16 MB allreduce | step predicted | "
             "step measured | E predicted | E measured | error | error on the 2-node work | "
             "E predicted with the 2-node baseline (error) | "
             "compute 1 node / 2 nodes / 2-node baseline | "
             "wait predicted (σ before) / on the 2-node work / measured | work per rank | "
             "exchange predicted "
             "(median fit) / measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # SIGTERM (Ctrl-C's sibling) must reach the finally below, which removes the nodes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    nodes = tool.Nodes.up(2)
    try:
        for cap in caps:
            nodes.cap(cap)
            label = f"{cap:g} Mbit/s" if cap else "uncapped"
            print(f"{label}: comm ...", file=sys.stderr, flush=True)
            comm = work / f"comm-{cap:g}"
            on_nodes(nodes, ["comm", "--ops", "allreduce", "--sizes", COMM_SIZES,
                             "--out", str(comm)])
            big = [r for r in json.loads((comm / "comm.json").read_text())["results"]
                   if r["bytes"] == 16 << 20][0]
            for model in MODELS:
                # the 1-node record right before the 2-node run, so that both meet the same
                # load from the rest of the machine (its link plays no part)
                # and once more right after it (A B A): predict takes the two 1-node records'
                # median compute, their mean, so that a drift in load meets both sides alike
                print(f"{label}: 1 node, 2 nodes, 1 node, {model} ...", file=sys.stderr,
                      flush=True)
                sides = [work / f"one-{model}-{cap:g}-{k}" for k in "ab"]
                ones = [one_node(nodes, model, args.steps, sides[0])]
                out = work / f"two-{model}-{cap:g}"
                on_nodes(nodes, train_args(model, args.steps, out))
                # the same two nodes with the exchange left out: what the two processes'
                # compute is when they share this machine (bench --baseline's contention run)
                base = work / f"base-{model}-{cap:g}"
                on_nodes(nodes, [*train_args(model, args.steps, base), "--sync", "none"])
                as_baseline(base)
                ones.append(one_node(nodes, model, args.steps, sides[1]))
                two = json.loads((out / "record.json").read_text())
                pred = predict.predict(predict.Options(
                    sources=[str(s) for s in sides], comm=str(comm), workers=(1, 2),
                    scaling="weak"))
                at2 = pred.curves["weak"][1]
                with_base = predict.predict(predict.Options(
                    sources=[*map(str, sides), str(base)], comm=str(comm), workers=(1, 2),
                    scaling="weak")).curves["weak"][1].efficiency
                base_compute = 1e3 * (json.loads((base / "record.json").read_text())
                                      ["steps"]["phases"]["compute"]["mean"])
                # the 1-node throughput over both runs: the mean step time's
                x1 = 2 / sum(1 / r["summary"]["steady_throughput"] for r in ones)
                x2 = two["summary"]["steady_throughput"]
                measured = x2 / (2 * x1)
                step2 = two["steps"]["phases"]["step"]["mean"]
                compute = [1e3 * statistics.fmean(r["steps"]["phases"]["compute"]["mean"]
                                                  + r["steps"]["phases"]["data"]["mean"]
                                                  for r in rs) for rs in (ones, [two])]
                # the model's own terms (wait + exchange) on the 2-node run's measured work:
                # what is left of the error once the inputs' drift in compute is taken out
                own = two["steps"]["work"]["mean"] + at2.wait_s + at2.exposed_s
                terms = measured * step2 / own - measured
                grad = pred.model.gradient_bytes / 1e6
                sync = two["steps"]["phases"]["sync"]["mean"]
                # the 2-node record's own wait (per step, the slower rank's work less each
                # rank's), so that the sync splits into waiting and exchanging as measured
                waited = (two["steps"].get("work") or {}).get("wait_s") or 0.0
                before = pred.model.spread_s * expected_max(2)  # the σ-from-p50/p95 wait
                # the same formula on the 2-node run's own work: is it the formula or its input?
                own_wait = wait.wait(wait.centred(two["steps"]["work"]["quantiles"]),
                                     two["steps"]["count"], 2)
                median = predict.predict(predict.Options(
                    sources=[str(s) for s in sides], comm=str(medians(comm)),
                    workers=(1, 2), scaling="weak")).curves["weak"][1].exposed_s
                ranks = " / ".join(f"{1e3 * (r.get('work_mean_s') or 0):.1f}"
                                   for r in two["steps"]["per_rank"])
                lines.append(
                    f"| {label} | {model} | {grad:.1f} MB | {big['time_s'] * 1e3:.1f} ms | "
                    f"{at2.step_s * 1e3:.1f} ms | {step2 * 1e3:.1f} ms | {at2.efficiency:.1%} | "
                    f"{measured:.1%} | {100 * (at2.efficiency - measured):+.1f} pp | "
                    f"{100 * terms:+.1f} pp | {with_base:.1%} ({100 * (with_base - measured):+.1f}"
                    " pp) | "
                    f"{compute[0]:.1f} / {compute[1]:.1f} / {base_compute:.1f} ms | "
                    f"{at2.wait_s * 1e3:.1f} "
                    f"({before * 1e3:.1f}) / {own_wait * 1e3:.1f} / {waited * 1e3:.1f} ms | "
                    f"{ranks} ms | "
                    f"{at2.exposed_s * 1e3:.1f} ({median * 1e3:.1f}) / "
                    f"{(sync - waited) * 1e3:.1f} ms |")
                print(lines[-1], flush=True)
    finally:
        nodes.down()
        if args.keep:
            shutil.copytree(work, args.keep, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
