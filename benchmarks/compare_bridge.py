#!/usr/bin/env python
"""Compare two sets of ``bench_bridge.py --json`` runs: each ratio, before and after.

One run's ratio moves by a few hundredths from run to run, more than a small
change costs, so a before/after comparison needs several runs of each tree,
made alternately on the same machine.  For every call, blocking and stream row
this prints:

* each side's ratio: the median of every per-repetition ratio of all its runs
  pooled (``ratio_samples`` in the JSON);
* the difference, after minus before, and a 95 % bootstrap interval for it
  (runs resampled, then repetitions within each run; seeded, so a rerun on the
  same files prints the same interval);
* the median of the per-pair differences, runs paired in the order given.

Run the same tree on both sides first (an A/A test): the spread it shows is what
the machine can resolve.  ``--check`` exits 1 when a row's difference is above
``--tolerance``::

    for i in 1 2 3 4 5; do
        PYTHONPATH=/tmp/before/src python benchmarks/bench_bridge.py --pin --clock cpu -q --json runs/before-$i.json
        python benchmarks/bench_bridge.py --pin --clock cpu -q --json runs/after-$i.json
    done
    python benchmarks/compare_bridge.py --before runs/before-*.json --after runs/after-*.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

_RESAMPLES = 2000


def load(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of one run that have a ratio against their baseline, by key."""
    rows = json.loads(path.read_text())["rows"]
    return {r["key"]: r for r in rows if "ratio_samples" in r and _compared(r["name"])}


def _compared(name: str) -> bool:
    return name.startswith("loopbridge")


def _pooled(runs: list[dict[str, dict[str, Any]]], key: str) -> float:
    return statistics.median(x for run in runs for x in run[key]["ratio_samples"])


def _resampled(runs: list[dict[str, dict[str, Any]]], key: str, rng: random.Random) -> float:
    xs: list[float] = []
    for run in rng.choices(runs, k=len(runs)):
        samples = run[key]["ratio_samples"]
        xs += rng.choices(samples, k=len(samples))
    return statistics.median(xs)


def compare(
    before: list[dict[str, dict[str, Any]]],
    after: list[dict[str, dict[str, Any]]],
    seed: int = 1,
) -> list[dict[str, Any]]:
    """One entry per row present in every run of both sides, in the first run's order."""
    keys = [k for k in before[0] if all(k in run for run in before + after)]
    rng = random.Random(seed)
    out = []
    for key in keys:
        b, a = _pooled(before, key), _pooled(after, key)
        diffs = sorted(
            _resampled(after, key, rng) - _resampled(before, key, rng) for _ in range(_RESAMPLES)
        )
        paired = [y[key]["ratio"] - x[key]["ratio"] for x, y in zip(before, after)]
        out.append(
            {
                "key": key,
                "before": b,
                "after": a,
                "diff": a - b,
                "low": diffs[int(0.025 * _RESAMPLES)],
                "high": diffs[int(0.975 * _RESAMPLES) - 1],
                "paired": statistics.median(paired),
            }
        )
    return out


def markdown(rows: list[dict[str, Any]], n_before: int, n_after: int, tolerance: float) -> str:
    lines = [
        f"{n_before} runs before, {n_after} after; ratios pooled over every repetition of each side.",
        "",
        "| row | before | after | after - before | 95 % interval | median of pairs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        flag = " **" if r["diff"] > tolerance else ""
        lines.append(
            f"| {r['key']} | {r['before']:.4f} | {r['after']:.4f} | {r['diff']:+.4f}{flag} "
            f"| {r['low']:+.3f} … {r['high']:+.3f} | {r['paired']:+.4f} |"
        )
    above = sum(r["diff"] > tolerance for r in rows)
    wholly = sum(r["low"] > tolerance for r in rows)
    worse = sum(r["diff"] > 0 for r in rows)
    lines += [
        "",
        f"{above} of {len(rows)} rows above +{tolerance} ({wholly} with the whole interval above); "
        f"{worse} of {len(rows)} higher after than before.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--before", type=Path, nargs="+", required=True, help="JSON runs of the baseline"
    )
    ap.add_argument("--after", type=Path, nargs="+", required=True, help="JSON runs to compare")
    ap.add_argument(
        "--tolerance", type=float, default=0.02, help="allowed rise in ratio (default 0.02)"
    )
    ap.add_argument("--seed", type=int, default=1, help="bootstrap seed (default 1)")
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if a row rises by more than the tolerance"
    )
    args = ap.parse_args(argv)
    if len(args.before) != len(args.after):
        ap.error(f"--before has {len(args.before)} runs and --after {len(args.after)}: pair them")
    before = [load(p) for p in args.before]
    after = [load(p) for p in args.after]
    rows = compare(before, after, args.seed)
    if not rows:
        ap.error("no row with a ratio is in every run (were they made with the same --only?)")
    print(markdown(rows, len(before), len(after), args.tolerance))
    return 1 if args.check and any(r["diff"] > args.tolerance for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
