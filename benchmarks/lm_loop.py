"""The language model's one-worker tokens/s: parascale's trainer against a plain hand-written loop.

Same model (parascale's `gpt`, 4 layers, 4 heads, width 128, context 64), same data (the
`shakespeare` corpus, the same windows in the same shuffled order), same batch (12), same
optimizer, one process with the same threads. The hand-written loop is what a user would write
without parascale: index the windows, forward, cross-entropy on the flattened logits, backward,
step. Both run in fresh interpreters, alternating (A B, B A, ...) so drifting machine load hits
both alike. Each reports its steady tokens/s over the steps after the first tenth (parascale's
own steady rule for a run shorter than an epoch); the figure is parascale / hand-written, per
round and as the median of rounds.

    .venv/bin/python benchmarks/lm_loop.py [--rounds 5] [--steps 300] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from alternating import cpu_name, rounds

RECIPE = dict(context=64, gpt_layers=4, gpt_heads=4, gpt_width=128, batch=12, lr=1e-3)


def hand(steps: int, threads: int, optimizer: str) -> float:
    """The plain loop, in this process: tokens/s over the steps after the first tenth."""
    import torch

    from parascale import models
    from parascale.config import TrainConfig
    from parascale.data import text
    from parascale.training.loop.sampling import epoch_order

    torch.set_num_threads(threads)
    cfg = TrainConfig.of(model="gpt", dataset="shakespeare", context=RECIPE["context"],
                         gpt_layers=RECIPE["gpt_layers"], gpt_heads=RECIPE["gpt_heads"],
                         gpt_width=RECIPE["gpt_width"])
    ids, vocab = text.encode(text.corpus())
    train = ids[:int(len(ids) * text.TRAIN_FRACTION)]
    t, b = RECIPE["context"], RECIPE["batch"]
    offsets = torch.arange(t + 1)
    order = epoch_order((len(train) - 1) // t, seed=0, epoch=1)  # parascale's order, seed 0
    torch.manual_seed(0)
    model = models.build("gpt", len(vocab), (t,), **models.options(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], betas=(0.9, 0.99),
                            weight_decay=0.1) if optimizer == "adamw" else \
        torch.optim.SGD(model.parameters(), lr=RECIPE["lr"], momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    skip = max(1, steps // 10)
    for step in range(steps):
        if step == skip:
            start = time.perf_counter()
        window = train[order[step * b:(step + 1) * b, None] * t + offsets].long()
        x, y = window[:, :-1], window[:, 1:]
        loss = loss_fn(model(x).flatten(0, -2), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (steps - skip) * b * t / (time.perf_counter() - start)


def run_hand(steps: int, threads: int, optimizer: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--hand", "--steps", str(steps),
                          "--threads", str(threads), "--optimizer", optimizer],
                         check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def run_parascale(steps: int, threads: int, optimizer: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        extra = ["--optimizer", "adamw", "--weight-decay", "0.1", "--adam-beta2", "0.99"] \
            if optimizer == "adamw" else ["--momentum", "0.9"]
        # a one-window validation split and no test set: evaluation is not what is compared
        subprocess.run([sys.executable, "-m", "parascale", "train", "--model", "gpt",
                        "--dataset", "shakespeare", "--workers", "1", "--threads", str(threads),
                        "--context", str(RECIPE["context"]), "--batch-size", str(RECIPE["batch"]),
                        "--steps", str(steps), "--lr", str(RECIPE["lr"]), *extra,
                        "--no-evaluate-test", "--val-fraction", "0.00001", "--no-save-model",
                        "--out", out], check=True, stdout=subprocess.DEVNULL)
        return json.loads(Path(out, "record.json").read_text())["summary"]["steady_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    parser.add_argument("--hand", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand:
        print(hand(args.steps, args.threads, args.optimizer))
        return
    rounds(args.rounds, lambda: run_hand(args.steps, args.threads, args.optimizer),
           lambda: run_parascale(args.steps, args.threads, args.optimizer), "tokens/s")
    import torch

    print(f"machine: {cpu_name()}, load {os.getloadavg()[0]:.1f}; torch "
          f"{torch.__version__}; 1 worker x {args.threads} thread(s), batch {RECIPE['batch']} x "
          f"{RECIPE['context']} tokens, {args.optimizer}, {args.steps} steps per run")


if __name__ == "__main__":
    main()
