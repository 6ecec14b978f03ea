"""Peak memory per rank under each sharded strategy against replicated allreduce, on 2 CPU
workers, with step time and throughput beside it, and predict's memory model and step time
checked against them (src/parascale/predict/memory.py and costs.py,
training/observe/memory_split.py).

The model: a wide MLP on digits (``wide`` below: 8x8 inputs, ``--layers`` hidden layers of
``--width``), large enough that its state dwarfs the rest. On the CPU the peak is the process's
resident set, which holds the interpreter, torch and the data too; so each strategy also runs a
tiny model of the same shape (width 16), and "model memory" is the difference of the two peaks.
Predicted: the memory model's bytes per device for that stage at N = 2, with the bytes per
parameter, the parameter count and the activations measured by the allreduce run's record
(fp32 SGD with momentum: 4 + 4 + 4 bytes), plus what the model leaves out and this script
names: DDP's gradient buckets (4 bytes per parameter under allreduce and zero). "as run" is
``memory.peak``: the most of the step with FSDP's transients (a unit's gradients whole and the
reduce-scatter's buffer, at stage 3 two units gathered), the evaluation's whole parameters, and
the start-up's (the model built whole; the FLOP count copies nothing).

Step time: ``parascale predict`` of each strategy at N = 2 (weak scaling, per-device batch 32)
from a 1-worker allreduce run of the same model and a ``parascale comm`` record of 2 workers on
this machine (the link fitted to it), against the 2-worker run's mean step.

    PYTHONPATH=src .venv/bin/python benchmarks/sharded_memory.py [--width 2048] [--layers 12]

With ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment, glibc maps every large buffer on its
own and unmaps it when freed, so the resident peak is what was live (and FSDP's steps slower).
Output and reading: benchmarks/RESULTS-sharded.md.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

from torch import nn

HERE = Path(__file__).resolve().parent


def wide(num_classes: int, input_shape: tuple[int, ...], width: int | None = None,
         layers: int | None = None) -> nn.Module:
    import os

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


def run(out: Path, width: int, layers: int, steps: int, **options) -> dict:
    import os

    import parascale

    os.environ["WIDE_WIDTH"], os.environ["WIDE_LAYERS"] = str(width), str(layers)
    workers = options.pop("workers", 2)
    record = parascale.train({"workers": workers, "model": "sharded_memory:wide",
                              "dataset": "digits", "global_batch": 32 * workers, "steps": steps,
                              "momentum": 0.9, "save_model": False, "out": str(out),
                              # one thread each at every N: the 1-worker run is the same device
                              "threads": 1, **options})
    assert record["status"] == "ok", record["reason"]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import os
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    from parascale.cli.main import main as cli
    from parascale.predict.forecast import Options, predict
    from parascale.predict.memory import PerParameter, from_record, largest_unit, peak, per_device
    from parascale.report.load import RunRecord

    mib = 2**20
    rows, steps = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one"
        run(one, args.width, args.layers, args.steps, workers=1)
        comm = Path(tmp) / "comm"
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(["comm", "--workers", "2", "--sizes", "1M,4M,16M,64M,256M",
                        "--ops", "allreduce", "--out", str(comm)]) == 0
        for i, (label, options, stage) in enumerate(CONFIGS):
            big = run(Path(tmp) / f"big{i}", args.width, args.layers, args.steps, **options)
            small = run(Path(tmp) / f"small{i}", 16, args.layers, args.steps, **options)
            rows.append((label, stage, big, small))
            pred = predict(Options([str(one), str(Path(tmp) / f"big{i}")], comm=str(comm),
                                   sync=STAGES[label], workers=(2,), scaling="weak",
                                   batch_size=32))
            point = pred.curves["weak"][0]
            steps[label] = (point.step_s, point.comm_s, big["steps"]["phases"]["step"]["mean"])
    os.environ["WIDE_WIDTH"] = str(args.width)  # the model the units are counted on
    ref = RunRecord(Path("the allreduce run"), "", rows[0][2])
    psi, b, acts, _ = from_record(ref)
    unit = largest_unit(ref) or 0
    print(f"wide MLP: {psi:,.0f} parameters ({psi * 4 / mib:,.0f} MiB in fp32), 2 workers, "
          f"global batch 64, {args.steps} steps, fp32 SGD with momentum "
          f"({b.params:g} + {b.grads:g} + {b.state:g} bytes per parameter, measured)")
    print(f"largest FSDP unit {unit:,} parameters; step times predicted from a 1-worker run and "
          "a 2-worker comm record")
    print(f"{'strategy':<14}{'peak MiB r0/r1':>16}{'tiny-model':>12}{'model MiB':>11}"
          f"{'held':>7}{'paper':>7}{'as run':>8}{'pred/meas':>11}{'step s':>8}"
          f"{'predicted':>11}{'(exchange)':>11}{'samples/s':>11}")
    buckets = PerParameter(0, b.grads, 0, "DDP's buckets")
    for label, stage, big, small in rows:
        peaks = big["memory"]["peak_bytes_per_rank"]
        base = max(small["memory"]["peak_bytes_per_rank"])
        measured = max(peaks) - base
        split = big["memory"]["split_per_rank"][0]
        held = sum(split[k] for k in ("parameters_bytes", "gradients_bytes",
                                      "optimizer_state_bytes", "activations_bytes"))
        paper = per_device(stage, psi, 2, b, acts)
        if stage <= 1:  # DDP's gradient buckets, a second copy of the gradients
            paper += per_device(0, psi, 2, buckets)
        # the buckets come with DDP, after the start-up's peak (the model built whole)
        predicted = max(peak(stage, psi, 2, b, acts, unit), paper)
        step_pred, exchange, step_meas = steps[label]
        print(f"{label:<14}{peaks[0] / mib:>9,.0f}/{peaks[1] / mib:<6,.0f}{base / mib:>12,.0f}"
              f"{measured / mib:>11,.0f}{held / mib:>7,.0f}{paper / mib:>7,.0f}"
              f"{predicted / mib:>8,.0f}{predicted / measured:>11.2f}{step_meas:>8.3f}"
              f"{step_pred:>11.3f}{exchange:>11.3f}"
              f"{big['summary']['steady_throughput'] or 0:>11,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
