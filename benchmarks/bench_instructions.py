#!/usr/bin/env python
"""Instructions and Python calls per operation: a load-independent A/B of the core.

Timed micro-benchmarks (``bench_bridge.py``) move by more than a small change
costs when the machine is busy.  This counts work instead of time:

* **instructions per operation**, with ``valgrind --tool=callgrind``: the whole
  process (both threads, both loops) runs a fixed workload of ``n1`` and then
  ``n2`` operations; the difference over ``n2 - n1`` cancels start-up and
  shutdown.  Valgrind runs one thread at a time, so batching is not what it is
  natively; read the numbers as a comparison between source trees, not as a
  cost.  Repeated runs agree to about 2%.
* **Python calls per operation** (``--calls``): every Python frame and C call
  entered, in both threads, counted the same way (exact, no valgrind needed).

Each ``--src`` is a source directory put first on ``PYTHONPATH`` (for example a
``git worktree`` of the commit to compare with); the first is the baseline::

    git worktree add /tmp/before <commit>
    python benchmarks/bench_instructions.py --src /tmp/before/src --src src
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

MODES = {  # mode: (n1, n2) operations
    "calls-c1": (1000, 3000),
    "calls-c16": (1600, 4800),
    "blocking": (1000, 3000),
    "stream": (20000, 60000),
}


class Service:
    async def noop(self, i: int) -> int:
        return i

    async def numbers(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


def workload(mode: str, n: int) -> None:
    """``n`` operations of one kind, from the main thread to a LoopThread owner."""
    from loopbridge import LoopThread, adopt, blocking, proxy

    async def build() -> Service:
        return adopt(Service())

    with LoopThread(name="owner", use_uvloop=False) as owner:
        p = proxy(owner.run(build))

        async def calls(workers: int) -> None:
            async def worker(k: int) -> None:
                for i in range(k):
                    await p.noop(i)

            await asyncio.gather(*(worker(n // workers) for _ in range(workers)))

        async def stream() -> None:
            async for _ in p.numbers(n):
                pass

        if mode == "calls-c1":
            asyncio.run(calls(1))
        elif mode == "calls-c16":
            asyncio.run(calls(16))
        elif mode == "blocking":
            b = blocking(p)
            for i in range(n):
                b.noop(i)
        elif mode == "stream":
            asyncio.run(stream())
        else:
            raise SystemExit(f"unknown mode {mode!r}: one of {', '.join(MODES)}")


def count_calls(mode: str, n: int) -> dict[str, int]:
    """Python frames and C calls entered, by name, in every thread."""
    counts: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_qualname}"] += 1
        elif event == "c_call":
            counts[f"C:{getattr(arg, '__qualname__', arg)}"] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        workload(mode, n)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return dict(counts)


def _child(src: str, *args: str, valgrind: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, __file__, *args]
    if valgrind is not None:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={valgrind}", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)


def instructions(src: str, mode: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = _child(src, "--workload", mode, str(n), valgrind=Path(tmp) / "callgrind.out")
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise SystemExit(f"no instruction count from valgrind:\n{out.stderr[-2000:]}")
    return int(match[1])


def per_op_instructions(src: str, mode: str) -> float:
    n1, n2 = MODES[mode]
    return (instructions(src, mode, n2) - instructions(src, mode, n1)) / (n2 - n1)


def per_op_calls(src: str, mode: str) -> dict[str, float]:
    n1, n2 = MODES[mode]
    a, b = (json.loads(_child(src, "--count-calls", mode, str(n)).stdout) for n in (n1, n2))
    return {k: (b.get(k, 0) - a.get(k, 0)) / (n2 - n1) for k in set(a) | set(b)}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--src",
        action="append",
        help="a source tree to measure (repeat; the first is the baseline)",
    )
    ap.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated (default {','.join(MODES)})"
    )
    ap.add_argument(
        "--calls",
        action="store_true",
        help="count Python calls per operation instead of instructions",
    )
    ap.add_argument("--workload", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--count-calls", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workload:
        workload(args.workload[0], int(args.workload[1]))
        return
    if args.count_calls:
        print(json.dumps(count_calls(args.count_calls[0], int(args.count_calls[1]))))
        return
    if not args.calls and shutil.which("valgrind") is None:
        raise SystemExit(
            "valgrind is not installed (Debian: apt-get install valgrind); --calls needs none"
        )
    srcs = args.src or [str(Path(__file__).resolve().parents[1] / "src")]
    modes = args.modes.split(",")
    print(
        f"{'instructions' if not args.calls else 'Python calls'} per operation; baseline {srcs[0]}\n"
    )
    print("| mode | " + " | ".join(srcs) + " |")
    print("|---|" + "---|" * len(srcs))
    for mode in modes:
        cells: list[str] = []
        base = 0.0
        for i, src in enumerate(srcs):
            value = (
                sum(per_op_calls(src, mode).values())
                if args.calls
                else per_op_instructions(src, mode)
            )
            base = base or value
            cells.append(f"{value:,.1f}" + (f" ({value / base:.3f}x)" if i else ""))
        print(f"| {mode} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
