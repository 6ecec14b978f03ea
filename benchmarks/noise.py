"""Is the gradient noise scale right, and is it cheap? (src/parascale/training/observe/noise.py)

1. Estimator validation, on real torch.distributed: 2 and 4 gloo worker processes on loopback.
   Least squares with x ~ N(0, I_d), y = x·w* + ε, ε ~ N(0, σ²), held at fixed parameters w = w*
   + r (no training, so the truth stays put): the per-sample gradient of loss = mean squared
   error / 2 is x(x·w − y), so G = r, tr(Σ) = (d + 1)|r|² + dσ² and B_simple = d + 1 + dσ²/|r|²
   exactly (tests/test_noise_scale.py derives it). Every rank draws its own batch of b samples
   per step from its own generator, computes its gradient with autograd, takes |g_i|²,
   all-reduces the gradients (sum / N, the average), takes |G_B|²; the same numbers go to
   ``parascale.training.observe.noise.estimate`` (small = b, big = N·b). To keep the part under
   ~2 minutes on 2 oversubscribed cores (one gloo all_reduce of a few floats costs ~0.7 ms on 2
   ranks and ~5 ms on 4 here), ``--chunk`` steps are computed in one autograd call (each step
   has its own row of a (chunk, d) copy of w, so row k's gradient is step k's) and all-reduced
   in one call: the arithmetic per step is the same as a step-by-step loop. The stated tolerance
   (``--tolerance``, fixed before the run): |relative error| <= 10 %, and separately |error| < 3
   jackknife standard errors. A training-path check follows: the same ``parascale train`` run
   (digits, smallcnn, 2 workers, one seed) under --sync allreduce and --sync reduce-broadcast,
   whose per-epoch noise figures must agree to rounding.
2. Cost: ``parascale train --workers 2`` with and without ``--no-noise-scale``, alternating
   (A B, B A, ...) so drifting machine load hits both alike; smallcnn on digits and resnet18 on
   a small synthetic set. Per round: the median steady step time
   (record["steps"]["phases"]["step"]["p50"]) and the steady throughput
   (record["summary"]["steady_throughput"]), as ratios measured / not measured. Then the two
   squared norms the measurement adds per step, timed alone on each model's real gradients.

    .venv/bin/python benchmarks/noise.py [--steps 15000] [--chunk 1000] [--rounds 6] \
        [--big-rounds 4] [--skip-validation] [--skip-training-check] [--skip-cost] [--skip-big]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parascale.runtime.local import open_store

DIMS, SIGMAS, OFFSETS, BATCHES, WORLDS = (10, 50), (0.5, 2.0), (0.3, 1.0), (8, 32), (2, 4)


def truth(d: int, sigma: float, r_norm: float) -> dict[str, float]:
    """The exact figures of the least-squares problem at w = w* + r."""
    trace = (d + 1) * r_norm ** 2 + d * sigma ** 2
    return {"trace_sigma": trace, "grad_sq": r_norm ** 2, "noise_scale": trace / r_norm ** 2}


def least_squares_worker(rank: int, world: int, port: int, settings: list[tuple], steps: int,
                         chunk: int, seed: int, queue) -> None:
    """One rank: for every setting, ``steps`` steps of its own batches at the fixed w; rank 0
    puts (setting, estimate, seconds) on the queue."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # the parent hosts the store on loopback (runtime.local.open_store): a tcp:// init_method
    # would have rank 0's TCPStore listen on every interface
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, is_master=False),
                            rank=rank, world_size=world)
    from parascale.training.observe.noise import estimate

    for index, (d, sigma, r_norm, b) in enumerate(settings):
        shared = torch.Generator().manual_seed(seed * 1000 + index)  # same w*, r on every rank
        w_star = torch.randn(d, generator=shared, dtype=torch.float64)
        r = torch.randn(d, generator=shared, dtype=torch.float64)
        r *= r_norm / r.norm()
        w = w_star + r
        own = torch.Generator().manual_seed(seed * 1000 + index + 10_007 * (rank + 1))
        local_rows, global_rows = [], []
        dist.barrier()
        started = time.perf_counter()
        for first in range(0, steps, chunk):
            k = min(chunk, steps - first)
            x = torch.randn(k, b, d, generator=own, dtype=torch.float64)
            y = x @ w_star + sigma * torch.randn(k, b, generator=own, dtype=torch.float64)
            weights = w.expand(k, d).clone().requires_grad_(True)  # row j: step j's parameters
            residual = (x @ weights.unsqueeze(-1)).squeeze(-1) - y  # k x b
            loss = (residual.square().mean(dim=1) / 2).sum()  # each step's MSE/2, summed
            loss.backward()
            g = weights.grad  # k x d: row j is this rank's gradient of step j
            mine = g.square().sum(dim=1)  # |g_i|² per step
            dist.all_reduce(g)  # SUM over ranks ...
            g /= world  # ... / N: the averaged gradient G_B of every step
            gathered = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(gathered, mine)
            local_rows.append(torch.stack(gathered, dim=1))  # k x ranks
            global_rows.append(g.square().sum(dim=1))  # |G_B|² per step
        took = time.perf_counter() - started
        if rank == 0:
            figures = estimate(torch.cat(local_rows), torch.cat(global_rows), small=b,
                               big=world * b)
            queue.put(((d, sigma, r_norm, b, world), figures, took))
    dist.barrier()  # gloo can abort a rank whose peer tears down first
    dist.destroy_process_group()


def validate(args) -> list[dict]:
    """Part 1: every setting on 2 and 4 real gloo ranks; print the table."""
    settings = list(itertools.product(DIMS, SIGMAS, OFFSETS, BATCHES))
    rows = []
    started = time.perf_counter()
    for world in WORLDS:
        store = open_store()  # loopback only, on a port the kernel picks
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(least_squares_worker,
                           args=(world, store.port, settings, args.steps, args.chunk, args.seed,
                                 queue), nprocs=world, start_method="spawn")
        while not queue.empty():
            (d, sigma, r_norm, b, n), figures, took = queue.get()
            rows.append({"d": d, "sigma": sigma, "r": r_norm, "b": b, "N": n, "seconds": took,
                         "true": truth(d, sigma, r_norm), **figures})
    total = time.perf_counter() - started
    rows.sort(key=lambda row: (row["d"], row["sigma"], row["r"], row["b"], row["N"]))
    tol = args.tolerance
    print(f"## 1. Estimator validation: least squares at fixed w, {args.steps:,} steps per "
          f"setting, gloo on 127.0.0.1\n")
    print(f"tolerance (stated before the run): |relative error of B_simple| <= {tol:.0%}; "
          f"also shown: |error| < 3 jackknife se\n")
    within_head = f"within {tol:.0%}"
    head = ("|  d |   σ |  ‖r‖ |  b | N | B = N·b | B_simple/B | true B_simple "
            "|     estimated ± se "
            f"| rel. error | tr(Σ) rel. err | ‖G‖² rel. err | {within_head:>10} | < 3 se |")
    print(head)
    print("|" + "|".join("-" * (len(c) - 1) + ":" for c in head.split("|")[1:-1]) + "|")
    for row in rows:
        true = row["true"]["noise_scale"]
        est, se = row["noise_scale"], row["noise_scale_se"]
        trace_err = row["trace_sigma"] / row["true"]["trace_sigma"] - 1
        grad_err = row["grad_sq"] / row["true"]["grad_sq"] - 1
        if est is None:
            row.update(rel=None, ok_tol=False, ok_se=False)
            shown, rel, ok_tol, ok_se = f"none: {row['noise_note']}", "-", "no", "no"
        else:
            row["rel"] = est / true - 1
            row["ok_tol"] = abs(row["rel"]) <= tol
            row["ok_se"] = se is not None and abs(est - true) < 3 * se
            shown = f"{est:,.1f} ± {se:,.1f}" if se is not None else f"{est:,.1f} ± ?"
            rel = f"{row['rel']:+.1%}"
            ok_tol, ok_se = ("yes" if row["ok_tol"] else "NO"), ("yes" if row["ok_se"] else "NO")
        print(f"| {row['d']:>2} | {row['sigma']:>3} | {row['r']:>4} | {row['b']:>2} | {row['N']} "
              f"| {row['N'] * row['b']:>7} | {true / (row['N'] * row['b']):>10.1f} "
              f"| {true:>13,.1f} | {shown:>18} | {rel:>10} "
              f"| {trace_err:>+14.1%} | {grad_err:>+13.1%} | {ok_tol:>10} | {ok_se:>6} |")
    within = sum(row["ok_tol"] for row in rows)
    within_se = sum(row["ok_se"] for row in rows)
    print(f"\nwithin {tol:.0%}: {within} of {len(rows)} settings; within 3 se: {within_se} of "
          f"{len(rows)}; part 1 took {total:.1f} s (all_reduce of {args.chunk} steps per call)")
    failed = [row for row in rows if not row["ok_tol"]]
    if failed:
        print("outside the tolerance: " + "; ".join(
            f"d={r['d']} σ={r['sigma']} ‖r‖={r['r']} b={r['b']} N={r['N']} "
            f"(B_simple/B = {r['true']['noise_scale'] / (r['N'] * r['b']):.0f})" for r in failed))
    return rows


def train(out: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "parascale", "train", "--workers", "2", "--no-save-model",
               "--out", str(out), *extra]
    for attempt in range(3):  # other engineers edit the tree: a half-written module can fail one
        try:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            break
        except subprocess.CalledProcessError:
            if attempt == 2:
                raise
            print(f"(a run failed, tried again after 20 s: {' '.join(command[3:])})", flush=True)
            time.sleep(20)
    return json.loads((out / "record.json").read_text())


def training_check(args) -> None:
    """Part 1b: the same run under both averaging strategies gives the same noise figures."""
    keys = ("noise_scale", "noise_scale_se", "grad_sq", "trace_sigma")
    extra = ["--model", "smallcnn", "--dataset", "digits", "--epochs", str(args.check_epochs),
             "--batch-size", "32", "--seed", "7", "--threads", "1"]
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("allreduce", "reduce-broadcast"):
            records[name] = train(Path(tmp, name), [*extra, "--sync", name])
    print(f"\n## 1b. Training path: parascale train {' '.join(extra)} --workers 2, "
          "--sync allreduce vs reduce-broadcast\n")
    print("| epoch | steps | allreduce B_simple ± se | reduce-broadcast B_simple ± se "
          "| max rel. diff (B, se, ‖G‖², tr Σ) |")
    print("|------:|------:|------------------------:|-------------------------------:"
          "|----------------------------------:|")
    worst = 0.0
    for a, b in zip(records["allreduce"]["epochs"], records["reduce-broadcast"]["epochs"]):
        diff = max(abs(a[k] - b[k]) / abs(b[k]) for k in keys
                   if a.get(k) is not None and b.get(k) is not None)
        worst = max(worst, diff)
        print(f"| {a['epoch']:>5} | {a['noise_steps']:>5} | {a['noise_scale']:>13,.2f} ± "
              f"{a['noise_scale_se']:>7,.2f} | {b['noise_scale']:>20,.2f} ± "
              f"{b['noise_scale_se']:>7,.2f} | {diff:>33.2e} |")
    print(f"\nlargest relative difference over epochs and figures: {worst:.2e}; final loss "
          f"{records['allreduce']['epochs'][-1]['train_loss']:.6f} vs "
          f"{records['reduce-broadcast']['epochs'][-1]['train_loss']:.6f}")


def cost(args, label: str, extra: list[str], rounds: int) -> None:
    """Part 2: alternate on / off runs; ratios of the steady step time and throughput."""
    step_ratios, rate_ratios = [], []
    phases = ("data", "compute", "sync", "optimizer")
    phase_ratios: dict[str, list[float]] = {k: [] for k in phases}
    print(f"\n### {label}: parascale train --workers 2 {' '.join(extra)} --no-save-model "
          f"[--no-noise-scale], {rounds} rounds\n")
    print("| round | order  | step p50 on (ms) | step p50 off (ms) | step ratio on/off "
          "| thr. on (samples/s) | thr. off | thr. ratio on/off | other cores on/off |")
    print("|------:|:-------|-----------------:|------------------:|------------------:"
          "|--------------------:|---------:|------------------:|:-------------------|")
    for r in range(rounds):
        order = ("on", "off") if r % 2 == 0 else ("off", "on")
        got = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in order:
                flags = [] if name == "on" else ["--no-noise-scale"]
                got[name] = train(Path(tmp, name), [*extra, *flags])
        assert got["on"]["noise"]["measured"] and not got["off"]["noise"]["measured"]
        step = {k: v["steps"]["phases"]["step"]["p50"] for k, v in got.items()}
        rate = {k: v["summary"]["steady_throughput"] for k, v in got.items()}
        load = {k: (v.get("machine") or {}).get("other_cores", float("nan"))
                for k, v in got.items()}
        for k in phases:
            on, off = (got[v]["steps"]["phases"][k]["p50"] for v in ("on", "off"))
            if on and off:
                phase_ratios[k].append(on / off)
        step_ratios.append(step["on"] / step["off"])
        rate_ratios.append(rate["on"] / rate["off"])
        print(f"| {r + 1:>5} | {'-'.join(order):<6} | {step['on'] * 1e3:>16.2f} "
              f"| {step['off'] * 1e3:>17.2f} | {step_ratios[-1]:>17.3f} | {rate['on']:>19,.0f} "
              f"| {rate['off']:>8,.0f} | {rate_ratios[-1]:>17.3f} "
              f"| {load['on']:.2f} / {load['off']:.2f} |", flush=True)
    print(f"\nmedian step-time ratio on/off: {statistics.median(step_ratios):.3f} "
          f"(min {min(step_ratios):.3f}, max {max(step_ratios):.3f}, n={rounds}); "
          f"median throughput ratio on/off: {statistics.median(rate_ratios):.3f} "
          f"(min {min(rate_ratios):.3f}, max {max(rate_ratios):.3f})")
    print("median p50 ratio on/off by phase (where the time goes): " + ", ".join(
        f"{k} {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
        for k, v in phase_ratios.items() if v))


def direct_cost(args) -> None:
    """Part 2b: the measurement's own arithmetic, timed alone (one thread, as a worker has):
    per step, |g_i|² of this rank's gradient (a norm per DDP bucket; summed) and the averaged
    gradient's get_total_norm, over a model's real gradients. A bound finer than the A/B runs."""
    from parascale.models import build

    torch.set_num_threads(1)
    print("\n### direct: the two squared norms per step, timed alone (1 thread, median of "
          f"{args.repeats} repeats)\n")
    print("| model | parameters | ‖g_i‖² over the flat gradient (ms) | get_total_norm² (ms) "
          "| sum (ms) |")
    print("|:------|-----------:|-----------------------------------:|---------------------:"
          "|---------:|")
    for name, classes, shape in (("smallcnn", 10, (1, 8, 8)), ("resnet18", 10, (3, 32, 32))):
        torch.manual_seed(0)
        model = build(name, classes, shape)
        loss = model(torch.randn(4, *shape)).square().mean()
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])

        def timed(fn) -> float:
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        # timed() calls each lambda at once, inside this iteration
        local = timed(lambda: torch.linalg.vector_norm(flat).double() ** 2)  # noqa: B023
        total = timed(lambda: torch.nn.utils.get_total_norm(grads) ** 2)  # noqa: B023
        print(f"| {name} | {flat.numel():>10,} | {local * 1e3:>34.3f} | {total * 1e3:>20.3f} "
              f"| {(local + total) * 1e3:>8.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=15_000, help="steps per setting (part 1)")
    parser.add_argument("--chunk", type=int, default=1_000,
                        help="steps computed and all-reduced per call (part 1)")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="stated relative tolerance on B_simple (part 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-epochs", type=int, default=3, help="epochs of part 1b's runs")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the smallcnn cost runs")
    parser.add_argument("--big-rounds", type=int, default=4,
                        help="rounds of the resnet18 cost runs")
    parser.add_argument("--repeats", type=int, default=50, help="repeats of part 2b's timings")
    parser.add_argument("--skip-validation", action="store_true")
    parser.add_argument("--skip-training-check", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument("--skip-big", action="store_true", help="no resnet18 cost runs")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"machine: {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"python {platform.python_version()}\n")
    if not args.skip_validation:
        validate(args)
    if not args.skip_training_check:
        training_check(args)
    if not args.skip_cost:
        print("\n## 2. Cost: noise scale measured (on) vs --no-noise-scale (off), alternating")
        cost(args, "smallcnn on digits", ["--model", "smallcnn", "--dataset", "digits",
                                          "--epochs", "6", "--batch-size", "32"], args.rounds)
        if not args.skip_big:
            cost(args, "resnet18 on synthetic 3x32x32",
                 ["--model", "resnet18", "--dataset", "synthetic", "--synthetic-shape",
                  "3,32,32", "--synthetic-size", "512", "--epochs", "3", "--batch-size", "32"],
                 args.big_rounds)
        direct_cost(args)


if __name__ == "__main__":
    main()
