"""Cost of the always-on ownership check on a ``@loop_affine`` async member.

Awaits the same trivial method, on the loop that owns the object, on two
instances: one of a ``@loop_affine`` class (every call goes through the check,
which runs at the coroutine's first step, compiled into the method itself) and
one of an identical undecorated class.  The batches alternate (and swap
order each repetition) so drift in machine load hits both alike; the cost is
the median over repetitions of the per-call difference.

    python benchmarks/bench_affinity_check.py
    python benchmarks/bench_affinity_check.py --loop uvloop --calls 200000 --reps 31
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import loopbridge as lb


class Plain:
    async def get(self, x: int) -> int:
        return x


@lb.loop_affine
class Owned:
    async def get(self, x: int) -> int:
        return x


async def batch(obj: Any, calls: int) -> float:
    """Nanoseconds per ``await obj.get(i)``."""
    get = obj.get
    t0 = time.perf_counter_ns()
    for i in range(calls):
        await get(i)
    return (time.perf_counter_ns() - t0) / calls


async def measure(calls: int, reps: int) -> dict[str, Any]:
    plain, owned = Plain(), Owned()
    assert lb.owner_loop(owned) is asyncio.get_running_loop()
    for obj in (plain, owned):  # warm up
        await batch(obj, calls // 10 or 1)
    rows: dict[str, list[float]] = {"plain": [], "checked": [], "off": []}
    for rep in range(reps):
        order = ["plain", "checked", "off"] if rep % 2 else ["off", "checked", "plain"]
        for kind in order:
            if kind == "off":
                old = lb.set_affinity_check("off")
                try:
                    rows[kind].append(await batch(owned, calls))
                finally:
                    lb.set_affinity_check(old)
            else:
                rows[kind].append(await batch(owned if kind == "checked" else plain, calls))
    diff = [c - p for c, p in zip(rows["checked"], rows["plain"])]
    diff_off = [o - p for o, p in zip(rows["off"], rows["plain"])]
    return {
        "calls_per_batch": calls,
        "reps": reps,
        "plain_ns_per_call": round(statistics.median(rows["plain"]), 1),
        "checked_ns_per_call": round(statistics.median(rows["checked"]), 1),
        "check_cost_ns": round(statistics.median(diff), 1),
        "check_cost_ns_min_max": [round(min(diff), 1), round(max(diff), 1)],
        "check_off_cost_ns": round(statistics.median(diff_off), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    if args.loop == "uvloop":
        import uvloop

        new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop
    loop = new_loop()
    try:
        result = loop.run_until_complete(measure(args.calls, args.reps))
    finally:
        loop.close()
    print(json.dumps({"loop": args.loop, **result}, indent=2))


if __name__ == "__main__":
    main()
