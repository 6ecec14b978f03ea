"""Rounds of two runs in alternation (A B, B A, ...), so that drifting machine load hits both
alike; the ratio of ours to theirs per round and as the median of rounds."""
from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable


def rounds(count: int, hand: Callable[[], float], ours: Callable[[], float],
           unit: str) -> list[float]:
    """Run ``count`` rounds, print each and the medians; the ratios ours / hand."""
    ratios, mine, theirs = [], [], []
    for r in range(count):
        order = ("hand", "parascale") if r % 2 == 0 else ("parascale", "hand")
        got = {name: (hand if name == "hand" else ours)() for name in order}
        mine.append(got["parascale"])
        theirs.append(got["hand"])
        ratios.append(got["parascale"] / got["hand"])
        print(f"round {r + 1}: hand-written {got['hand']:,.0f} {unit}, parascale "
              f"{got['parascale']:,.0f} {unit}, ratio {ratios[-1]:.3f}", flush=True)
    print(f"\nmedian ratio parascale / hand-written: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}, n={len(ratios)} rounds); "
          f"medians {statistics.median(mine):,.0f} vs {statistics.median(theirs):,.0f} {unit}")
    return ratios


def cpu_name() -> str:
    return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name")), platform.processor()) + \
        f", {os.cpu_count()} cores"
