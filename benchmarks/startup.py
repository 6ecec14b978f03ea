"""What does starting cost? parascale's fixed cost beside torchrun's and a bare ``import torch``.

Prints, from one alternating run on this machine (no thresholds; medians with ranges):

- the wall time of ``python -c "import torch"`` and ``"import torch.distributed"``;
- ``torchrun --standalone --nproc-per-node 2`` on benchmarks/ddp_one_step.py against
  ``parascale train --model mlp --dataset digits --image-size 28 --workers 2 --steps 1``
  (``--pairs`` alternating pairs, each a fresh command), and their ratio;
- in one process running configurations back to back (as a study does), the gap between one
  configuration's end and the next one's first step (``timing.first_step_at``, docs/record.md);
- one worker's steady throughput (LeNet, digits 28x28, batch 32) beside a plain single-process
  loop (no DistributedDataParallel, same model, data and batch);
- with ``--demo``, the wall time of ``parascale demo``.

    .venv/bin/python benchmarks/startup.py [--pairs 5] [--demo]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable
TRAIN = ["--model", "mlp", "--dataset", "digits", "--image-size", "28", "--workers", "2",
         "--steps", "1", "--no-save-model"]


def wall(argv: list[str], tries: int = 1) -> float:
    """The wall time of ``argv``'s first run, of ``tries``, that exits 0."""
    for _ in range(tries):
        start = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if done.returncode == 0:
            return time.perf_counter() - start
    raise SystemExit(f"{' '.join(argv)} failed {tries} time(s) (exit code {done.returncode})")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s  ({min(values):.2f}-{max(values):.2f}, n={len(values)})"


def commands(pairs: int) -> None:
    torch_import, dist_import, torchrun, parascale = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            torch_import.append(wall([PY, "-c", "import torch"]))
            dist_import.append(wall([PY, "-c", "import torch.distributed"]))
            order = [("torchrun", torchrun), ("parascale", parascale)]
            for name, times in order if i % 2 == 0 else order[::-1]:
                if name == "torchrun":
                    # torch 2.14's rank 0 now and then aborts at exit ("terminate called
                    # without an active exception") after its step: that run is run again
                    times.append(wall([PY, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc-per-node", "2", str(HERE / "ddp_one_step.py")],
                                      tries=3))
                else:
                    times.append(wall([PY, "-m", "parascale", "train", *TRAIN,
                                       "--out", f"{tmp}/run{i}"]))
    ratios = [p / t for p, t in zip(parascale, torchrun)]
    print(f"python -c 'import torch'              {spread(torch_import)}")
    print(f"python -c 'import torch.distributed'  {spread(dist_import)}")
    print(f"torchrun, 2 ranks, 1 DDP step          {spread(torchrun)}")
    print(f"parascale train, 2 workers, 1 step     {spread(parascale)}")
    print(f"  parascale / torchrun (pairwise)      {statistics.median(ratios):6.2f}   "
          f"({min(ratios):.2f}-{max(ratios):.2f})")
    print(f"  parascale / torchrun (means)         "
          f"{statistics.mean(parascale) / statistics.mean(torchrun):6.2f}   "
          f"({statistics.mean(parascale):.2f} s / {statistics.mean(torchrun):.2f} s)")


def study_gap(configs: int) -> None:
    """Configurations back to back in one process, as ``parascale bench`` runs them."""
    import parascale

    gaps, ended = [], None
    for i in range(configs):
        record = parascale.train({"model": "mlp", "dataset": "digits", "image_size": 28,
                                  "workers": 1 + i % 2, "steps": 2, "save_model": False})
        if ended is not None:
            gaps.append(record["timing"]["first_step_at"] - ended)
        ended = time.time()
    print(f"study: end of one configuration to the next one's first step  {spread(gaps)}")


def plain_loop(batch: int, epochs: int) -> float:
    """Steady samples/s of a bare loop on the same data pipeline: median epoch after the first."""
    import torch

    from parascale import data, models
    from parascale.config import TrainConfig

    torch.set_num_threads(os.cpu_count() or 1)  # what one parascale worker gets: every core
    split = data.build(TrainConfig.of(model="lenet", dataset="digits", image_size=28)).train
    torch.manual_seed(0)
    model = models.build("lenet", 10, (1, 28, 28))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rates = []
    for _ in range(epochs):
        order, start = torch.randperm(len(split)), time.perf_counter()
        steps = len(split) // batch
        for x, y in split.batches([order[s * batch:(s + 1) * batch] for s in range(steps)],
                                  torch.device("cpu"), train=True):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        rates.append(steps * batch / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def throughput(rounds: int, epochs: int = 4) -> None:
    import parascale

    ours, plain = [], []
    for _ in range(rounds):
        record = parascale.train({"model": "lenet", "dataset": "digits", "image_size": 28,
                                  "workers": 1, "batch_size": 32, "epochs": epochs,
                                  "save_model": False})
        ours.append(record["summary"]["steady_throughput"])
        plain.append(plain_loop(32, epochs))
    ratios = [o / p for o, p in zip(ours, plain)]
    print(f"1 worker, lenet digits 28x28 batch 32: parascale {statistics.median(ours):,.0f} "
          f"samples/s, plain loop {statistics.median(plain):,.0f}; ratio "
          f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--configs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--demo", action="store_true")
    args = parser.parse_args()
    print(f"# {os.cpu_count()} cores; {' '.join(sys.argv)}; load average before "
          f"{os.getloadavg()[0]:.2f}")
    commands(args.pairs)
    study_gap(args.configs)
    throughput(args.rounds)
    if args.demo:
        with tempfile.TemporaryDirectory() as tmp:
            took = wall([PY, "-m", "parascale", "demo", "--out", f"{tmp}/demo"])
        print(f"parascale demo  {took:.1f} s")
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
