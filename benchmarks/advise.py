"""Does ``parascale advise`` choose well? For three jobs, advise's recommendation against an
exhaustive study of the same space with the same budget, and its predictions against
measurement.

    .venv/bin/python benchmarks/advise.py [--jobs digits,regression,gpt] [--workers 2]
                                          [--repeat 3] [--quiet-machine 60] [--out bench-advise]

Per job: ``parascale advise`` (its measurements here, its search, its table), then every
configuration of the space it searched run to the target as one study (bench's runner:
resumable, each run recorded), ``--repeat`` times in turn and averaged, and a table of
predicted against measured time to the target, with the step and the epochs apart so that a
miss says where it comes from. The summary: the
space covered, the recommendation's measured time against the best measured one (the issue
asks for within 15 %), and how many predictions fall within 25 % of measurement.

The jobs: ResNet-20 on digits to a test loss; the dict-batch regression of
examples/regression.py to a test mean absolute error; parascale's GPT on a slice of
Shakespeare (benchmarks/advise_tasks.py) to a validation loss. Run it on a quiet machine
(other programs take cores from the runs, and the times are what is compared).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the jobs' own modules (examples/regression.py, benchmarks/advise_tasks.py), for this process
# and the workers it starts
for folder in (ROOT / "examples", ROOT / "benchmarks"):
    sys.path.insert(0, str(folder))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT / "examples"), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])

JOBS = {
    "digits": ({"model": "resnet20", "dataset": "digits", "batch_size": 32, "lr": 0.02,
                "target_metric": "loss", "target_value": 0.15, "epochs": 12},
               (16, 32, 64, 128)),
    "regression": ({"task": "regression:task", "optimizer": "adamw", "lr": 0.003,
                    "batch_size": 32, "target_metric": "mae", "target_value": 0.13,
                    "epochs": 40}, (16, 32, 64, 128)),
    "gpt": ({"task": "advise_tasks:shakespeare_gpt", "optimizer": "adamw", "lr": 0.003,
             "batch_size": 32, "target_metric": "loss", "target_value": 2.35, "epochs": 10},
            (16, 32, 64)),
}
STRATEGIES = ("allreduce", "reduce-broadcast")


def echo(line: str) -> None:
    print(line, flush=True)


def averaged(runs: list[dict]) -> dict:
    """One configuration's check over its runs: the mean measured time and step (the runs
    that reached the goal; none if any did not), the error and band against that mean."""
    check = dict(runs[0])
    times = [r["measured_s"] for r in runs]
    steps = [r["measured_step_s"] for r in runs if r["measured_step_s"] is not None]
    got = statistics.mean(times) if None not in times else None
    check.update(measured_s=got, runs=len(runs),
                 measured_step_s=statistics.mean(steps) if steps else None,
                 busy=any(r["busy"] for r in runs),
                 error=(check["predicted_s"] - got) / got if got else None,
                 within_band=(check["low_s"] <= got <= check["high_s"]) if got else None)
    epochs = sorted({r["measured_epochs"] for r in runs if r["measured_epochs"] is not None})
    check["measured_epochs"] = epochs[0] if len(epochs) == 1 else \
        (statistics.mean(epochs) if epochs else None)
    return check


def one(name: str, workers: int, out: Path, quiet: float | None, repeat: int) -> dict:
    from parascale.advise import Options, advise, output, verify

    job, batches = JOBS[name]
    began = time.monotonic()
    opts = Options(job=dict(job), workers=workers, strategies=STRATEGIES, batch_sizes=batches,
                   max_accumulate=1, exact_only=True, out=str(out / name),
                   quiet_machine=quiet)
    advice, folder = advise(opts, echo)
    advised = time.monotonic() - began
    echo("")
    echo(output.text(advice, opts.job, True))
    space = [f for f in advice.forecasts if f.why_not is None or "budget" in f.why_not]
    ordered = ([advice.recommended] if advice.recommended else []) + \
        [f for f in space if f is not advice.recommended]
    began = time.monotonic()
    # each configuration run `repeat` times (whole studies in turn, so drifting load hits all
    # alike): a run of a second or two varies by 10-15 % from one to the next, as much as the
    # configurations near the top differ, so one run each would rank noise
    rounds = [verify.run(advice, opts.job, ordered, folder / f"exhaustive-{k + 1}", True, echo,
                         quiet_max_s=quiet) for k in range(repeat)]
    checks = [averaged([r[i] for r in rounds]) for i in range(len(ordered))]
    studied = time.monotonic() - began
    advice.checks = checks
    output.write(advice, opts.job, folder, True)
    echo("")
    echo(verify.table(checks))
    done = [c for c in checks if c["measured_s"] is not None]
    best = min(done, key=lambda c: c["measured_s"]) if done else None
    chosen = next((c for c in checks if c["recommended"]), None)
    errors = [abs(c["error"]) for c in done]
    return {"job": name, "space": advice.space, "configurations": len(ordered),
            "advise_s": advised, "study_s": studied, "withheld": advice.withheld,
            "recommended": chosen, "best": best,
            "ratio": (chosen["measured_s"] / best["measured_s"]) if chosen and best
            and chosen["measured_s"] else None,
            "within_25": sum(e <= 0.25 for e in errors), "measured": len(done),
            "median_error": statistics.median(errors) if errors else None}


def summary(results: list[dict]) -> str:
    from parascale.advise.output import seconds
    from parascale.columns import aligned

    rows = [["job", "space", "configs", "recommended", "its time", "best measured", "time",
             "ratio", "within 25%", "median |error|", "advise", "study"]]
    for r in results:
        rec, best = r["recommended"], r["best"]
        space = r["space"]
        rows.append([
            r["job"], f"N {space['devices']}, b {space['batches']}, "
            f"{'/'.join(space['strategies'])}", str(r["configurations"]),
            rec["configuration"] if rec else f"none ({(r['withheld'] or '')[:40]}...)",
            seconds(rec["measured_s"]) if rec and rec["measured_s"] else "-",
            best["configuration"] if best else "-",
            seconds(best["measured_s"]) if best else "-",
            f"{r['ratio']:.2f}" if r["ratio"] else "-",
            f"{r['within_25']}/{r['measured']}",
            f"{r['median_error']:.0%}" if r["median_error"] is not None else "-",
            seconds(r["advise_s"]), seconds(r["study_s"])])
    return aligned(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quiet-machine", type=float, default=None, metavar="MAX_S")
    parser.add_argument("--out", default="bench-advise")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each configuration, averaged")
    args = parser.parse_args()
    names = [n.strip() for n in args.jobs.split(",") if n.strip()]
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        sys.exit(f"unknown job {unknown[0]!r}; the jobs: {', '.join(JOBS)}")
    began = time.monotonic()
    echo(f"# {os.cpu_count()} cores; load average before {os.getloadavg()[0]:.2f}")
    results = [one(name, args.workers, Path(args.out), args.quiet_machine, args.repeat)
               for name in names]
    echo("")
    echo(f"advise against an exhaustive study of its space ({args.workers} workers at most, "
         f"the mean of {args.repeat} run(s) per configuration, {time.monotonic() - began:.0f} s "
         "in all):")
    echo(summary(results))
    echo(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
