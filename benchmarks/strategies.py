"""What does each synchronisation strategy cost? Throughput and exposed sync at 1, 2 and 4 workers.

Every strategy trains the same model (smallcnn on the digits at 16x16: 0.55M parameters, 2.2 MB
of fp32 gradients, so communication is not negligible) with the same per-device batch (weak
scaling), gloo on CPU, through the public API. Each run records its steady throughput (samples
over the slowest rank's epoch time, median over the epochs after the first) and the step
phases gathered from every rank (p50 and mean). Runs alternate strategies inside a round so
that drifting machine load hits all alike; with several rounds the table shows the median.

    .venv/bin/python benchmarks/strategies.py [--workers 1,2,4] [--rounds 1] [--epochs 3]
        [--only allreduce,ps-sync-1] [--json benchmarks/RESULTS-strategies.json]

The table is Markdown, ready for benchmarks/RESULTS-strategies.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import parascale

STRATEGIES = {
    "allreduce": dict(sync="allreduce"),
    "allreduce-fp16": dict(sync="allreduce", compression="fp16"),
    "allreduce-powersgd-r1": dict(sync="allreduce", compression="powersgd"),
    "reduce-broadcast": dict(sync="reduce-broadcast"),
    "ps-sync-1": dict(sync="parameter-server"),
    "ps-sync-2": dict(sync="parameter-server", ps_servers=2),
    "ps-async-1": dict(sync="parameter-server", ps_mode="async"),
    "local-sgd-H4": dict(sync="local-sgd", period=4),
    "none (baseline)": dict(sync="none"),
}


def run(name: str, workers: int, args: argparse.Namespace) -> dict:
    options = dict(model="smallcnn", dataset="digits", image_size=args.image_size,
                   workers=workers, batch_size=args.batch, epochs=args.epochs, lr=0.05,
                   save_model=False, timeout=120.0, **STRATEGIES[name])
    start = time.perf_counter()
    record = parascale.train(options)
    if record["status"] != "ok":
        raise SystemExit(f"{name} on {workers} worker(s) failed: {record['reason']}")
    phases = record["steps"]["phases"]
    sync = record.get("sync") or {}
    staleness = (sync.get("staleness") or {}).get("mean")
    return {"strategy": name, "workers": workers,
            "throughput": record["summary"]["steady_throughput"],
            "step_p50_s": phases["step"]["p50"], "compute_p50_s": phases["compute"]["p50"],
            "sync_p50_s": phases["sync"]["p50"], "sync_mean_s": phases["sync"]["mean"],
            "optimizer_p50_s": phases["optimizer"]["p50"],
            "bytes_per_step": record["derived"]["bytes_per_step"],
            "final_test_accuracy": record["summary"]["final_test_accuracy"],
            "staleness_mean": staleness, "steps_measured": record["steps"]["count"],
            "wall_s": time.perf_counter() - start}


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per (strategy, workers): the median of each number over the rounds."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["strategy"], row["workers"]), []).append(row)
    merged = []
    for (name, workers), group in groups.items():
        row = {"strategy": name, "workers": workers, "rounds": len(group)}
        for key, value in group[0].items():
            if key not in row and isinstance(value, (int, float)):
                values = [g[key] for g in group if g[key] is not None]
                row[key] = statistics.median(values) if values else None
            elif key not in row:
                row[key] = value
        merged.append(row)
    return merged


def table(rows: list[dict]) -> str:
    base = {r["strategy"]: r["throughput"] for r in rows if r["workers"] == 1}
    head = ("| strategy | workers | samples/s | speedup vs 1 | step p50 ms | compute p50 ms "
            "| sync p50 ms | sync mean ms | bytes/step (rank 0 sends) | test acc |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        speedup = r["throughput"] / base[r["strategy"]] if r["strategy"] in base else None
        sent = "—" if r["bytes_per_step"] is None else f"{r['bytes_per_step']:,}"
        lines.append(
            f"| {r['strategy']} | {r['workers']} | {r['throughput']:,.0f} | "
            + (f"{speedup:.2f}" if speedup else "—")
            + f" | {r['step_p50_s'] * 1e3:.1f} | {r['compute_p50_s'] * 1e3:.1f} | "
              f"{r['sync_p50_s'] * 1e3:.2f} | {r['sync_mean_s'] * 1e3:.2f} | {sent} | "
              f"{r['final_test_accuracy']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="per-device batch")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--only", help="comma-separated strategy labels (default: all)")
    parser.add_argument("--json", type=Path, help="write every run's summary here")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(STRATEGIES)
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        parser.error(f"unknown strategy label(s) {unknown}; choose from {list(STRATEGIES)}")
    sizes = [int(w) for w in args.workers.split(",")]
    rows = []
    for r in range(args.rounds):
        for workers in sizes:
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                row = run(name, workers, args)
                rows.append(row)
                print(f"round {r + 1}: {name} x{workers}: {row['throughput']:,.0f} samples/s, "
                      f"sync p50 {row['sync_p50_s'] * 1e3:.2f} ms", file=sys.stderr, flush=True)
    merged = sorted(median_rows(rows), key=lambda r: (names.index(r["strategy"]), r["workers"]))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(table(merged))
    print(f"\nmachine: {cpu}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the end; torch {torch.__version__}; smallcnn "
          f"{args.image_size}x{args.image_size}, batch {args.batch} per worker, {args.epochs} "
          f"epochs, {args.rounds} round(s)")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "median": merged}, indent=1) + "\n")


if __name__ == "__main__":
    main()
