"""The validation loss parascale reaches with nanoGPT's published CPU recipe, on 1 and 2 workers.

nanoGPT's README trains its Shakespeare character model on a laptop CPU with: 4 layers, 4 heads,
width 128, context 64, batch 12, 2,000 iterations, AdamW at 1e-3 (beta2 0.99, weight decay 0.1)
with 100 warm-up iterations and cosine decay to 1e-4, gradients clipped at norm 1, no dropout,
and reports a validation loss of about 1.88 after about 3 minutes, on its 1 MB extract
(tinyshakespeare). parascale runs the same recipe on its own corpus (the `shakespeare` package's
78 files, 9.6 million characters, the last 10% held out), on 1 worker with batch 12 and on 2
workers with 6 each (the same global batch, so the same trajectory up to float rounding), and
prints the loss on the whole held-out part.

    nice .venv/bin/python benchmarks/lm_recipe.py [--workers 1,2] [--steps 2000] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RECIPE = ["--model", "gpt", "--dataset", "shakespeare", "--context", "64", "--gpt-layers", "4",
          "--gpt-heads", "4", "--gpt-width", "128", "--global-batch", "12",
          "--optimizer", "adamw", "--lr", "1e-3", "--adam-beta2", "0.99", "--weight-decay", "0.1",
          "--warmup-steps", "100", "--lr-schedule", "cosine", "--lr-min", "1e-4",
          "--clip-grad-norm", "1", "--no-noise-scale",
          "--eval-batches", "0"]  # the whole held-out part, not the default's sample of it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", default="runs/lm-recipe")
    args = parser.parse_args()
    results = []
    for n in (int(w) for w in args.workers.split(",")):
        out = Path(args.out) / f"n{n}"
        subprocess.run([sys.executable, "-m", "parascale", "train", *RECIPE, "--workers", str(n),
                        "--threads", "1", "--steps", str(args.steps), "--out", str(out)],
                       check=True)
        record = json.loads((out / "record.json").read_text())
        s = record["summary"]
        results.append(
            f"{n} worker(s): validation loss {s['final_test_loss']:.4f} nats/char (perplexity "
            f"{s['final_test_perplexity']:.2f}), train loss {s['final_train_loss']:.4f}; "
            f"training {s['total_time_s']:.0f} s, {s['steady_tokens_per_s']:,.0f} tokens/s, "
            f"{s['flops_per_step'] / 1e9:.2f} GFLOP per step, MFU {s['mfu']:.1%} of the "
            f"measured peak; busy machine: {(record.get('machine') or {}).get('busy')}")
    print()
    print("\n".join(results))
    print(f"recipe: {' '.join(RECIPE)} --steps {args.steps} --threads 1; load "
          f"{os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
