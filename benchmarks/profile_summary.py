#!/usr/bin/env python
"""Summarize a py-spy profile recorded with ``--format raw`` (collapsed stacks).

Prints, per thread (with ``--threads`` recordings) or overall, the functions
with the most *self* samples (where the CPU actually was) and the most
*inclusive* samples (on the stack at all), as a Markdown table.

    py-spy record --format raw --threads -o prof.txt -- python benchmarks/bench_bridge.py ...
    python benchmarks/profile_summary.py prof.txt --top 15
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LOC = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _short(frame: str) -> str:
    """``func (path/to/mod.py:12)`` -> ``func (mod.py)``: lines merge per function."""
    m = _LOC.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m['func']} ({Path(m['file']).name})"


def parse(
    path: Path, exclude: tuple[str, ...] = ()
) -> dict[str, tuple[Counter[str], Counter[str], int]]:
    """thread -> (self samples, inclusive samples, total samples).

    Stacks with a frame containing one of ``exclude`` are dropped (e.g. start-up:
    ``_find_and_load``).
    """
    out: dict[str, tuple[Counter[str], Counter[str], int]] = {}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        if exclude and any(x in stack for x in exclude):
            continue
        frames = stack.split(";")
        thread = "all"
        if frames and frames[0].startswith(("thread ", "process ")):
            # py-spy puts "process ..." and/or "thread (0x..)" roots first.
            roots = []
            while frames and frames[0].startswith(("thread ", "process ")):
                roots.append(frames.pop(0))
            thread = " / ".join(roots)
        if not frames:
            continue
        names = [_short(f) for f in frames]
        # py-spy names a thread only on some samples: merge by its id.
        m = re.search(r"thread \((\w+)\)", thread)
        if m:
            known = [k for k in out if f"thread ({m[1]})" in k]
            if known:
                if len(thread) > len(known[0]):
                    out[thread] = out.pop(known[0])
                else:
                    thread = known[0]
        selfc, incl, total = out.get(thread, (Counter(), Counter(), 0))
        selfc[names[-1]] += n
        for name in set(names):
            incl[name] += n
        out[thread] = (selfc, incl, total + n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, help="py-spy --format raw output")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--thread", default=None, help="only threads whose label contains this")
    ap.add_argument(
        "--exclude",
        default="",
        help="comma-separated: drop stacks with a frame containing any of these (e.g. _find_and_load,Stack.start)",
    )
    ap.add_argument(
        "--min-share", type=float, default=0.02, help="skip threads with less of the samples"
    )
    args = ap.parse_args()
    data = parse(args.profile, tuple(x for x in args.exclude.split(",") if x))
    grand = sum(t for _, _, t in data.values()) or 1
    for thread, (selfc, incl, total) in sorted(data.items(), key=lambda kv: -kv[1][2]):
        if args.thread and args.thread not in thread:
            continue
        if total / grand < args.min_share:
            continue
        print(f"\n#### {thread}: {total} samples ({100 * total / grand:.0f}% of all)\n")
        print("| self % | function | | inclusive % | function |")
        print("|---|---|---|---|---|")
        tops = selfc.most_common(args.top)
        topi = incl.most_common(args.top)
        for i in range(max(len(tops), len(topi))):
            a = tops[i] if i < len(tops) else ("", 0)
            b = topi[i] if i < len(topi) else ("", 0)
            pa = f"{100 * a[1] / total:.1f}" if a[0] else ""
            pb = f"{100 * b[1] / total:.1f}" if b[0] else ""
            print(f"| {pa} | `{a[0]}` | | {pb} | `{b[0]}` |")


if __name__ == "__main__":
    main()
