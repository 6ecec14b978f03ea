#!/usr/bin/env python3
"""What the suite's tests cost, from a folder suite_costs.py and sitecustomize.py wrote
(.ci/costs/README.md): the costliest tests and files by CPU, with wall time, processes started
and seconds slept."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def load(folder: Path) -> list[dict]:
    tests = [json.loads(line) for line in (folder / "tests.jsonl").read_text().splitlines()]
    starts_file = folder / "starts.jsonl"
    starts = [json.loads(line) for line in starts_file.read_text().splitlines()] \
        if starts_file.exists() else []
    by_group = defaultdict(list)
    for test in tests:
        test["starts"] = 0
        by_group[test["cgroup"]].append(test)
    for start in starts:  # a start belongs to the test its pytest worker ran at that moment
        for test in by_group.get(start["cgroup"], []):
            if test["start"] <= start["t"] <= test["end"]:
                test["starts"] += 1
                break
    return tests


def table(tests: list[dict], top: int) -> None:
    slow = [t for t in tests if t["slow"]]
    print(f"{len(tests)} tests ({len(slow)} slow): CPU {sum(t['cpu'] for t in tests):.0f} s "
          f"(slow {sum(t['cpu'] for t in slow):.0f} s), wall summed {sum(t['wall'] for t in tests):.0f} s, "
          f"{sum(t['starts'] for t in tests)} processes started")
    print(f"\n{'CPU s':>7} {'wall s':>7} {'procs':>5} {'slept':>6}  test")
    for t in sorted(tests, key=lambda t: -t["cpu"])[:top]:
        print(f"{t['cpu']:7.1f} {t['wall']:7.1f} {t['starts']:5d} {t['slept']:6.1f}  {t['id']}")
    files: dict[str, list[dict]] = defaultdict(list)
    for t in tests:
        files[t["id"].split("::")[0]].append(t)
    print(f"\n{'CPU s':>7} {'wall s':>7} {'procs':>5} {'tests':>5} {'longest':>7}  file")
    for name, ts in sorted(files.items(), key=lambda kv: -sum(t["cpu"] for t in kv[1]))[:top]:
        print(f"{sum(t['cpu'] for t in ts):7.1f} {sum(t['wall'] for t in ts):7.1f} "
              f"{sum(t['starts'] for t in ts):5d} {len(ts):5d} {max(t['wall'] for t in ts):7.1f}  "
              f"{name}")


def remove_empty_groups() -> None:
    """suite_costs.py's groups that outlived their worker (its fork server was still in it)."""
    for group in CPUACCT.glob("suite-costs-*"):
        try:
            group.rmdir()
        except OSError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    remove_empty_groups()
    tests = load(args.folder)
    table(tests, args.top)


if __name__ == "__main__":
    main()
