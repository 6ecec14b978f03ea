"""A 1- and 2-worker strong-scaling study of the language model, and its report.

The recipe's model and batch (gpt: 4 layers, 4 heads, width 128, context 64; global batch 12, so
6 per worker on 2), each configuration run twice, in tokens/s with the model-FLOPs utilisation.
Evaluation is on a one-window validation split only: the study measures throughput, and the
whole held-out tenth of the corpus would take longer than the steps.

    .venv/bin/python benchmarks/lm_study.py [--steps 300] [--repeat 2] [--out studies/lm]
"""
from __future__ import annotations

import argparse
import subprocess
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default="studies/lm")
    args = parser.parse_args()
    parascale = [sys.executable, "-m", "parascale"]
    subprocess.run([*parascale, "bench", "--model", "gpt", "--dataset", "shakespeare",
                    "--workers", "1,2", "--scaling", "strong", "--global-batch", "12",
                    "--steps", str(args.steps), "--repeat", str(args.repeat), "--threads", "1",
                    "--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.1",
                    "--adam-beta2", "0.99", "--clip-grad-norm", "1",
                    "--no-evaluate-test", "--val-fraction", "0.00001", "--no-save-model",
                    "--rerun", "always", "--out", args.out], check=True)
    subprocess.run([*parascale, "report", args.out], check=True)


if __name__ == "__main__":
    main()
