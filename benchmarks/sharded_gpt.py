"""A GPT whose parameters, gradients and AdamW state do not fit one worker's memory, trained on
4 CPU workers each capped by --device-memory: ``--sync fsdp`` trains within the cap, and
``--sync allreduce`` under the same cap ends as ``oom`` in one line. Beside them, the memory
model's prediction of an fsdp rank's peak (src/parascale/predict/memory.py), held to the
measured one: each worker's cgroup peak, less that of the same run on a tiny GPT (what a worker
needs whatever the model: its data, gloo's buffers, the pages it writes of its own).

    PYTHONPATH=src .venv/bin/python benchmarks/sharded_gpt.py [--width 1024] [--layers 24]
        [--workers 4] [--cap 2GiB] [--steps 3]

The command line of each run is printed; ``parascale train`` with it reproduces the run (README,
"Sharded strategies"). Output and reading: benchmarks/RESULTS-sharded.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def train(out: Path, sync: str, width: int, layers: int, args) -> tuple[dict, str, list[str]]:
    """One run through the command line: its record, the last line it printed on stderr, and
    the command."""
    command = ["parascale", "train", "--model", "gpt", "--dataset", "shakespeare",
               "--context", "64", "--gpt-width", str(width), "--gpt-layers", str(layers),
               "--gpt-heads", str(max(1, width // 64)), "--optimizer", "adamw", "--lr", "3e-4",
               "--batch-size", "1", "--steps", str(args.steps), "--workers", str(args.workers),
               "--sync", sync, "--device-memory", args.cap, "--no-evaluate-test",
               "--val-fraction", "0.0005", "--no-noise-scale", "--no-save-model",
               "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True,
                          check=False)
    if not (out / "record.json").exists():
        raise SystemExit(f"{' '.join(command)} wrote no record:\n{proc.stderr[-2000:]}")
    record = json.loads((out / "record.json").read_text())
    return record, (proc.stderr.strip().splitlines() or [""])[-1], command


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cap", default="2GiB")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    from parascale.predict.memory import from_record, largest_tensor, largest_unit, peak
    from parascale.report.load import RunRecord

    mib = 2**20
    print(f"load average at the start: {load()}")
    with tempfile.TemporaryDirectory() as tmp:
        fsdp, _, command = train(Path(tmp) / "fsdp", "fsdp", args.width, args.layers, args)
        print("$ " + " ".join(command))
        tiny, _, _ = train(Path(tmp) / "tiny", "fsdp", 64, 1, args)
        replicated, said, command = train(Path(tmp) / "allreduce", "allreduce", args.width,
                                          args.layers, args)
        print("$ " + " ".join(command))
    psi, b, acts, _ = from_record(RunRecord(Path("the fsdp run"), "", fsdp))
    whole = (b.params + b.grads + b.state) * psi
    print(f"GPT: {psi:,.0f} parameters; {b.params:g} + {b.grads:g} + {b.state:g} bytes per "
          f"parameter (fp32 AdamW): {whole / mib:,.0f} MiB of parameters, gradients and "
          f"optimizer state, against a cap of {args.cap} per worker")
    assert fsdp["status"] == "ok", fsdp["reason"]
    peaks = fsdp["memory"]["cgroup_peak_bytes_per_rank"]
    base = max(tiny["memory"]["cgroup_peak_bytes_per_rank"])
    split = fsdp["memory"]["split_per_rank"][0]
    held = sum(split[k] for k in ("parameters_bytes", "gradients_bytes",
                                  "optimizer_state_bytes", "activations_bytes"))
    ref = RunRecord(Path("the fsdp run"), "", fsdp)
    unit, largest = largest_unit(ref) or 0, largest_tensor(ref) or 0
    stage = fsdp["config"].get("stage", 3)
    predicted = peak(stage, psi, args.workers, b, acts, unit, largest)
    measured = max(peaks) - base
    phases = fsdp["steps"]["phases"]
    print(f"--sync fsdp: {fsdp['status']}; cgroup peak per rank (MiB): "
          + ", ".join(f"{p / mib:,.0f}" for p in peaks)
          + f"; tiny GPT's {base / mib:,.0f}; the model's {measured / mib:,.0f}, held "
          f"{held / mib:,.0f} (rank 0's split), predicted {predicted / mib:,.0f} "
          f"(largest unit {unit:,}, largest tensor {largest:,}): measured/predicted "
          f"{measured / predicted:.2f}")
    print(f"  start-up {fsdp['timing']['startup_s']:.0f} s, mean step "
          f"{phases['step']['mean']:.1f} s, whole command {fsdp['timing']['command_s']:.0f} s")
    print(f"--sync allreduce: {replicated['status']}; it said: {said}")
    print(f"load average at the end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
