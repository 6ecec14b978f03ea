"""Peak memory per rank under each sharded strategy against replicated allreduce, on 2 CPU
workers, with step time and throughput beside it, and predict's memory model and step time
checked against them (src/parascale/predict/memory.py and costs.py,
training/observe/memory_split.py).

Two models: ``wide``, an MLP on digits (``--layers`` hidden layers of ``--width``) trained by
SGD with momentum, and ``gpt``, the GPT on Shakespeare (``--layers`` blocks of ``--width``)
trained by AdamW. Each worker runs in a memory cgroup of its own (``--device-memory``, a cap
far above the need), whose peak counts what the worker allocates and not the pages it shares
with the fork server (the interpreter, torch); each strategy also runs a tiny model of the same
shape (width 16), and "model MiB" is the difference of the two peaks. Predicted: the memory
model's bytes per device for that stage at N = 2, with the bytes per parameter, the parameter
count and the activations measured by the allreduce run's record, plus DDP's gradient buckets
(a copy of the gradients under allreduce and zero), which the model names but leaves out; "as
run" is ``memory.peak``: the most of the step with FSDP's transients (a unit's gradients whole
and the reduce-scatter's buffer, at stage 3 two units gathered) and the start-up (the model
built whole, or under fsdp shard by shard with its largest tensor whole).

Step time: ``parascale predict`` of each strategy at N = 2 (weak scaling) from a 1-worker
allreduce run of the same model and a ``parascale comm`` record of 2 workers on this machine
(the link fitted to it), against the 2-worker run's mean step.

    PYTHONPATH=src .venv/bin/python benchmarks/sharded_memory.py [--model wide|gpt]
        [--width 2048] [--layers 12] [--steps 8]

With ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment every worker maps each large buffer
on its own, as fsdp's workers do by themselves (training/loop/building.py); without it, allreduce's
and zero's keep glibc's default. Output and reading: benchmarks/RESULTS-sharded.md.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

from torch import nn

HERE = Path(__file__).resolve().parent
CAP = "6GiB"  # far above any run here: the cgroup is there for its peak, not its limit


def wide(num_classes: int, input_shape: tuple[int, ...], width: int | None = None,
         layers: int | None = None) -> nn.Module:
    width = width or int(os.environ.get("WIDE_WIDTH", "2048"))
    layers = layers or int(os.environ.get("WIDE_LAYERS", "12"))
    features = 1
    for d in input_shape:
        features *= d
    body: list[nn.Module] = [nn.Flatten(), nn.Linear(features, width), nn.ReLU()]
    for _ in range(layers):
        body += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(width, num_classes))


STAGES = {"allreduce": "allreduce", "zero": "zero", "fsdp stage 2": "fsdp",
          "fsdp stage 3": "fsdp"}
CONFIGS = [("allreduce", dict(sync="allreduce"), 0), ("zero", dict(sync="zero"), 1),
           ("fsdp stage 2", dict(sync="fsdp", sync_options={"stage": 2}), 2),
           ("fsdp stage 3", dict(sync="fsdp", sync_options={"stage": 3}), 3)]


def job(model: str, width: int, layers: int) -> dict:
    """The training options of ``model`` at this size (and the environment the wide one
    reads its size from)."""
    if model == "gpt":
        return {"model": "gpt", "dataset": "shakespeare", "context": 64, "gpt_width": width,
                "gpt_layers": layers, "gpt_heads": max(1, width // 64), "optimizer": "adamw",
                "batch_size": 2, "evaluate_test": False, "val_fraction": 0.001}
    os.environ["WIDE_WIDTH"], os.environ["WIDE_LAYERS"] = str(width), str(layers)
    return {"model": "sharded_memory:wide", "dataset": "digits", "momentum": 0.9,
            "batch_size": 32}


def run(out: Path, options: dict, steps: int, **more) -> dict:
    import parascale

    record = parascale.train({"workers": 2, "steps": steps, "save_model": False,
                              "noise_scale": False, "out": str(out), "device_memory": CAP,
                              # one thread each at every N: the 1-worker run is the same device
                              "threads": 1, **options, **more})
    assert record["status"] == "ok", record["reason"]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("wide", "gpt"), default="wide")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    from parascale.cli.main import main as cli
    from parascale.predict.forecast import Options, predict
    from parascale.predict.memory import (PerParameter, from_record, largest_tensor,
                                          largest_unit, peak, per_device)
    from parascale.report.load import RunRecord

    mib = 2**20
    big = job(args.model, args.width, args.layers)
    rows, steps = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one"
        run(one, big, args.steps, workers=1)
        comm = Path(tmp) / "comm"
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["comm", "--workers", "2", "--sizes", "1M,4M,16M,64M,256M",
                        "--ops", "allreduce", "--out", str(comm)]) == 0
        for i, (label, options, stage) in enumerate(CONFIGS):
            small = run(Path(tmp) / f"small{i}", job(args.model, 16, args.layers), args.steps,
                        **options)
            large = run(Path(tmp) / f"big{i}", job(args.model, args.width, args.layers),
                        args.steps, **options)
            rows.append((label, stage, large, small))
            pred = predict(Options([str(one), str(Path(tmp) / f"big{i}")], comm=str(comm),
                                   sync=STAGES[label], workers=(2,), scaling="weak",
                                   batch_size=big["batch_size"]))
            point = pred.curves["weak"][0]
            steps[label] = (point.step_s, point.comm_s, large["steps"]["phases"]["step"]["mean"])
    job(args.model, args.width, args.layers)  # the model the units are counted on
    ref = RunRecord(Path("the allreduce run"), "", rows[0][2])
    psi, b, acts, _ = from_record(ref)
    unit, largest = largest_unit(ref) or 0, largest_tensor(ref) or 0
    what = "GPT, AdamW" if args.model == "gpt" else "wide MLP, SGD with momentum"
    print(f"{what}: {psi:,.0f} parameters ({psi * 4 / mib:,.0f} MiB in fp32), 2 workers, "
          f"batch {big['batch_size']} per worker, {args.steps} steps, fp32 ({b.params:g} + "
          f"{b.grads:g} + {b.state:g} bytes per parameter, measured); "
          f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}")
    print(f"largest FSDP unit {unit:,} parameters, largest tensor {largest:,}; step times "
          "predicted from a 1-worker run and a 2-worker comm record")
    print(f"{'strategy':<14}{'cgroup MiB r0/r1':>18}{'tiny-model':>12}{'model MiB':>11}"
          f"{'held':>7}{'paper':>7}{'as run':>8}{'pred/meas':>11}{'step s':>8}"
          f"{'predicted':>11}{'(exchange)':>11}{'samples/s':>11}")
    buckets = PerParameter(0, b.grads, 0, "DDP's buckets")
    for label, stage, large, small in rows:
        peaks = large["memory"]["cgroup_peak_bytes_per_rank"]
        base = max(small["memory"]["cgroup_peak_bytes_per_rank"])
        measured = max(peaks) - base
        split = large["memory"]["split_per_rank"][0]
        held = sum(split[k] for k in ("parameters_bytes", "gradients_bytes",
                                      "optimizer_state_bytes", "activations_bytes"))
        paper = per_device(stage, psi, 2, b, acts)
        if stage <= 1:  # DDP's gradient buckets, a second copy of the gradients
            paper += per_device(0, psi, 2, buckets)
        # the buckets come with DDP, after the start-up (the model built whole)
        predicted = max(peak(stage, psi, 2, b, acts, unit, largest), paper)
        step_pred, exchange, step_meas = steps[label]
        print(f"{label:<14}{peaks[0] / mib:>11,.0f}/{peaks[1] / mib:<6,.0f}"
              f"{base / mib:>12,.0f}{measured / mib:>11,.0f}{held / mib:>7,.0f}"
              f"{paper / mib:>7,.0f}{predicted / mib:>8,.0f}{predicted / measured:>11.2f}"
              f"{step_meas:>8.3f}{step_pred:>11.3f}{exchange:>11.3f}"
              f"{large['summary']['steady_throughput'] or 0:>11,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
