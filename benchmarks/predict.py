"""Does ``parascale predict`` predict? Two checks, written to benchmarks/RESULTS-predict.md.

1. Here: from a 1-worker run and a ``parascale comm`` record, predict the 2-worker weak-scaling
   efficiency, then measure it; and predict it again with the study's 2-worker contention
   baseline (``bench --baseline``: the same processes, no exchange) as well. Each round runs a
   study (1 and 2 workers and their baselines, one thread per worker, so a device is one core
   throughout) and the comm measurement, in ABBA order across rounds so that drift in the
   machine's load hits both alike; the predictions of a round use that round's records only. The error is
   in percentage points of efficiency (predicted − measured), and each run's machine block says
   how busy the machine was.
2. Against published tables: DLBS's ResNet-50 weak-scaling example (HPE's Deep Learning
   Benchmarking Suite documentation, github.com/HewlettPackard/dlcookbook-dlbs) and the BSC
   ResNet-V2 figures (Jordi Torres, "Supercomputing for Artificial Intelligence",
   jorditorresbcn.github.io/supercomputing-for-ai-book), predicted from their single-device times and a stated preset.

    .venv/bin/python benchmarks/predict.py [--rounds 3] [--model smallcnn] [--epochs 4] \
        [--quiet-machine 60]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from parascale import predict
from parascale.bench.quiet import wait_for_quiet
from parascale.files import atomic_write_text
from parascale.predict import calibrate, costs
from parascale.predict.gradient import count_parameters
from parascale.predict.interconnect import preset
from parascale.predict.model import Model, Work

RESULTS = Path(__file__).with_name("RESULTS-predict.md")
COMM_SIZES = "64K,256K,1M,4M,16M"  # brackets the gradients of smallcnn (0.6 MB), resnet20 (1.1 MB)


def study(out: Path, args) -> dict[str, Path]:
    """A weak-scaling study at 1 and 2 workers with contention baselines; each run's record."""
    command = [sys.executable, "-m", "parascale", "bench", "--model", args.model, "--dataset",
               "digits", "--scaling", "weak", "-V", "workers=1,2", "--baseline", "--threads",
               "1", "--batch-size", str(args.batch), "--epochs", str(args.epochs),
               "--no-save-model", "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    found = {}
    for path in sorted(out.glob("runs/*/record.json")):
        rec = json.loads(path.read_text())
        base = "b" if (rec.get("study") or {}).get("baseline") else ""
        found[f"{rec['derived']['world_size']}w{base}"] = path
    return found


def comm(out: Path) -> None:
    command = [sys.executable, "-m", "parascale", "comm", "--workers", "2", "--ops", "allreduce",
               "--sizes", COMM_SIZES, "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def load_text(record: dict) -> str:
    m = record.get("machine") or {}
    return f"{m.get('other_cores', float('nan')):.2f}{' busy' if m.get('busy') else ''}"


def _compute_ms(record: dict) -> float:
    """Mean forward + backward (+ data) per step: what contention between processes slows."""
    phases = record["steps"]["phases"]
    return 1e3 * (phases["compute"]["mean"] + phases["data"]["mean"])


def here(args) -> tuple[list[str], list[float]]:
    """Rounds of (study, comm) in ABBA order; table lines (with the median errors and where the
    miss comes from) and each round's error in points without baselines."""
    lines = ["| round | order | 1 worker (samples/s) | 2 workers (samples/s) | measured E | "
             "predicted E | error | predicted E with baseline | error | "
             "sync per step predicted (wait + exposed) / measured (ms) | "
             "compute per step 1w / 2w baseline / 2w (ms) | other cores 1w / 2w | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errors, based_errors = [], []
    quiet_errors = []  # the rounds where neither run's record says the machine was busy
    misses = []  # per round: ms the 2-worker step exceeded the prediction, by compute, by sync
    for k in range(1, args.rounds + 1):
        folder = Path(tempfile.mkdtemp(prefix="parascale-bench-predict-"))
        try:
            order = ("study", "comm") if k % 2 else ("comm", "study")
            load_before = os.getloadavg()[0]
            for step in order:
                print(f"round {k}/{args.rounds}: {step} ...", file=sys.stderr, flush=True)
                if args.quiet_machine > 0:  # as bench --quiet-machine: wait, then run anyway
                    wait_for_quiet(args.quiet_machine,
                                   lambda line: print(line, file=sys.stderr, flush=True))
                if step == "comm":
                    comm(folder / "comm")
                else:
                    paths = study(folder / "study", args)
            load_after = os.getloadavg()[0]
            runs = {name: json.loads(path.read_text()) for name, path in paths.items()}
            preds = {}
            for label, names in (("alone", ["1w"]), ("based", ["1w", "2wb"])):
                opts = predict.Options(sources=[str(paths[n]) for n in names],
                                       comm=str(folder / "comm"), workers=(1, 2),
                                       scaling="weak")
                preds[label] = predict.predict(opts)
            at2 = preds["alone"].curves["weak"][1]
            with_base = preds["based"].curves["weak"][1]
            x1 = runs["1w"]["summary"]["steady_throughput"]
            x2 = runs["2w"]["summary"]["steady_throughput"]
            measured = x2 / (2 * x1)
            error = 100 * (at2.efficiency - measured)
            errors.append(error)
            based_errors.append(100 * (with_base.efficiency - measured))
            if not any((runs[r].get("machine") or {}).get("busy") for r in ("1w", "2w")):
                quiet_errors.append(error)
            phases2 = runs["2w"]["steps"]["phases"]
            misses.append((1e3 * (phases2["step"]["mean"] - at2.step_s),
                           _compute_ms(runs["2w"]) - _compute_ms(runs["1w"]),
                           1e3 * (phases2["sync"]["mean"] - at2.wait_s - at2.exposed_s),
                           1e3 * (phases2["step"]["mean"] - with_base.step_s)))
            exposed = phases2["sync"]["mean"]
            lines.append(f"| {k} | {' → '.join(order)} | {x1:.0f} | {x2:.0f} | {measured:.1%} | "
                         f"{at2.efficiency:.1%} | {error:+.1f} pp | {with_base.efficiency:.1%} | "
                         f"{based_errors[-1]:+.1f} pp | {at2.wait_s * 1e3:.2f} + "
                         f"{at2.exposed_s * 1e3:.2f} / {exposed * 1e3:.2f} | "
                         f"{_compute_ms(runs['1w']):.2f} / {_compute_ms(runs['2wb']):.2f} / "
                         f"{_compute_ms(runs['2w']):.2f} | {load_text(runs['1w'])} / "
                         f"{load_text(runs['2w'])} | {load_before:.1f} → {load_after:.1f} |")
            print(lines[-1], flush=True)
            if k == 1:
                lines_inputs = [f"  - {i.line()}" for i in preds["based"].model.inputs]
                here.inputs = lines_inputs  # type: ignore[attr-defined]
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if misses:
        step, compute, sync, based = (statistics.median(m[i] for m in misses) for i in range(4))
        lines += ["", f"Where the miss comes from (medians over the rounds): the 2-worker step "
                  f"was {step:.2f} ms longer than predicted without a baseline ({based:.2f} ms "
                  f"with it); its compute was {compute:.2f} ms longer than the 1-worker run's "
                  "(two processes sharing the machine's cores: what the baseline measures), and "
                  f"its sync {sync:.2f} ms longer than the comm record's exchange plus the "
                  "predicted wait (gloo exchanging on cores that also compute, and ranks "
                  "drifting apart under that contention: no baseline measures that)."]
    lines += ["", f"Median error over {len(errors)} round(s): without baselines "
              f"{statistics.median(errors):+.1f} pp (range {min(errors):+.1f} to "
              f"{max(errors):+.1f}); with the study's 2-worker baseline "
              f"{statistics.median(based_errors):+.1f} pp (range {min(based_errors):+.1f} to "
              f"{max(based_errors):+.1f}). Without baselines, over the "
              f"{len(quiet_errors)} round(s) where neither run saw a busy machine: "
              + (f"{statistics.median(quiet_errors):+.1f} pp (range {min(quiet_errors):+.1f} to "
                 f"{max(quiet_errors):+.1f})." if quiet_errors else "none.")]
    return lines, errors


def published() -> list[str]:
    """DLBS's and BSC's weak-scaling efficiencies against the model, from one device's time."""
    lines = ["| study | model (parameters) | per-device batch | preset | N | published E | "
             "predicted E (φ = 2/3) | error | predicted E, no overlap (φ = 0) | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    cases = []
    # DLBS: ResNet-50 (25.6 M parameters), batch 16 per GPU, 913.44 ms per batch on one GPU
    cases.append(("DLBS", "ResNet-50", 25.6e6, 16, 0.91344, {2: 0.8874, 4: 0.8575}))
    # BSC (H100, second epoch, CIFAR-10 at 128x128: 50,000 samples an epoch): the per-GPU batch
    # is not stated; 256 is assumed (an epoch of 14 s is then 196 steps of 71 ms)
    for name, timm_name, epoch1, eff in (("ResNet50V2", "timm:resnetv2_50", 14.0,
                                          {2: 14 / 16, 4: 14 / 20}),
                                         ("ResNet152V2", "timm:resnetv2_152", 33.0,
                                          {2: 33 / 36, 4: 33 / 40})):
        params = count_parameters(timm_name, 10, (3, 128, 128))
        cases.append(("BSC", name, float(params), 256, epoch1 / (50000 / 256), eff))
    for study, name, params, batch, step1, eff in cases:
        size = params * 4
        for link_name in ("pcie", "nvlink"):
            models = [Model(Work(step1 / batch, 0.0, 0.0), size, costs.strategy("allreduce"),
                            preset(link_name), phi, calibrate.buckets_for(size))
                      for phi in (calibrate.ASSUMED_OVERLAP, 0.0)]
            for n, published_e in eff.items():
                cells = []
                for model in models:
                    e = model.point("weak", n, batch, batch).efficiency
                    cells.append(f"{e:.1%} | {100 * (e - published_e):+.1f} pp")
                lines.append(f"| {study} | {name} ({params / 1e6:.1f} M) | {batch} | {link_name} "
                             f"| {n} | {published_e:.1%} | {' | '.join(cells)} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="smallcnn")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help=f"where to write the results (default: {RESULTS.name} beside this)")
    parser.add_argument("--quiet-machine", type=float, default=60.0, metavar="MAX_S",
                        help="before each run, wait up to MAX_S seconds for other programs to "
                             "leave the cores (0: do not wait)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        sys.exit("needs 2 cores")
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (f"{platform.node()}, {cores} cores, {began}; {args.model} on digits, batch "
            f"{args.batch} per worker, {args.epochs} epochs, one thread per worker; "
            f"comm sizes {COMM_SIZES}")
    print("# " + head, flush=True)
    rows, _ = here(args)
    table = published()
    print("\n".join(table))
    inputs = getattr(here, "inputs", [])
    text = "\n".join([
        "# parascale predict: predicted against measured",
        "",
        "Written by `.venv/bin/python benchmarks/predict.py "
        f"--rounds {args.rounds} --model {args.model} --epochs {args.epochs} "
        f"--batch {args.batch} --quiet-machine {args.quiet_machine:g}` ({head}).",
        "",
        "## Here: 2 workers predicted from 1 worker and a comm record, with and without a baseline",
        "",
        "Each round: `parascale bench -V workers=1,2 --baseline` (1- and 2-worker runs and their "
        "no-exchange baselines) and `parascale comm --workers 2` (ABBA order over rounds), all "
        "with one thread per worker. The first prediction uses that round's 1-worker record and "
        "comm record only (`predict.Options(sources=[1w], comm=comm, workers=(1, 2), "
        "scaling='weak')`); the second adds the 2-worker baseline record (sources=[1w, 2w "
        "baseline]), whose measured compute then replaces the 1-worker compute at N = 2; "
        "measured E = X_2 / (2·X_1) from the records' steady throughput. "
        "Before each run the benchmark waited up to --quiet-machine seconds for other programs to "
        "leave the cores (as `bench --quiet-machine`), then ran anyway. "
        "'compute per step': data + forward + backward, mean (without a baseline the model takes "
        "the 1-worker figure for every N). "
        "'other cores': cores used by other programs during the run (its record's machine "
        "block; 'busy' above the threshold); load avg: 1-minute load before and after the round. "
        "The machine was shared with other developers' tests while this ran.",
        "",
        *rows,
        "",
        "Inputs of round 1's prediction, as `parascale predict` prints them:",
        "",
        *inputs,
        "",
        "## Published tables, from one device's time and a preset",
        "",
        "DLBS's documented ResNet-50 weak-scaling example and the BSC H100 figures "
        "(HPE's Deep Learning Benchmarking Suite documentation, "
        "github.com/HewlettPackard/dlcookbook-dlbs; Jordi Torres, \"Supercomputing for "
        "Artificial Intelligence\", jorditorresbcn.github.io/supercomputing-for-ai-book). "
        "The single-device step time is all work (no split into "
        "phases is published); gradients are fp32 (4 bytes per parameter; ResNet-V2 counts "
        "from timm, 10 classes, built without weights); DDP's 25 MiB buckets; overlap φ assumed "
        "2/3. BSC's per-GPU batch is not published: 256 is assumed. BSC's GPUs are H100s, "
        "whose NVLink 4 (450 GB/s) is faster than the nvlink preset (A100's 300 GB/s): the "
        "preset only makes communication slower, and it is already negligible. "
        "Read the table as how much of the published loss communication explains: even with "
        "no overlap at all, the α-β model puts it at 1–12 points at 2–4 GPUs on PCIe and about "
        "1 point or less on NVLink, while the studies lost 8–30 points. The rest is what the model "
        "leaves out (per-step framework overhead, input pipelines, stragglers the published "
        "figures do not describe); for the BSC figures an assumed larger batch would only "
        "shrink the communication share further.",
        "",
        *table,
        "",
    ])
    atomic_write_text(args.results, text)
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
