"""Memory soak: calls and short-lived loop-affine objects in a process that never
reads its metrics.  RSS must stay flat (within ``--tolerance-mib``) after warm-up.

One million calls by default: each of ``--objects`` objects is made on an owner
``LoopThread``, called once through a proxy from another loop and dropped (the
shape of a recipe's per-request result), and the rest of the calls go to one
long-lived object.  The calls run in ``--rounds`` equal rounds, ``--tasks``
concurrent tasks each; RSS (``/proc/self/statm``) is read after every round.
The first ``--warmup`` rounds are warm-up (allocator arenas, caches, the first
histogram folds); the growth reported is the highest RSS after warm-up minus
RSS at the end of warm-up.  Exit status 1 when it exceeds the tolerance.

    python soak/metrics_memory.py
    python soak/metrics_memory.py --calls 200000 --objects 20000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time

import loopbridge as lb

MIB = 1024 * 1024


@lb.loop_affine
class Item:
    async def ping(self) -> int:
        return 1


async def _make() -> Item:
    return Item()


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


async def _round(
    owner: lb.LoopThread, long_lived: Item, calls: int, objects: int, tasks: int
) -> int:
    """``calls`` calls, ``objects`` of them on fresh objects, from ``tasks`` tasks."""
    loop = owner.loop

    async def worker(n_calls: int, n_objects: int) -> int:
        done = 0
        for i in range(n_calls):
            if i < n_objects:
                obj = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_make(), loop))
                done += await lb.proxy(obj).ping()
                del obj
            else:
                done += await long_lived.ping()
        return done

    per_calls, per_objects = calls // tasks, objects // tasks
    results = await asyncio.gather(*(worker(per_calls, per_objects) for _ in range(tasks)))
    return sum(results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--tolerance-mib", type=float, default=5.0)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    with lb.LoopThread(name="soak-owner", use_uvloop=False) as owner:
        long_lived = lb.proxy(owner.run(_make))
        start = rss_mib()
        readings: list[float] = []
        done = 0
        for r in range(args.rounds):
            done += asyncio.run(
                _round(
                    owner,
                    long_lived,
                    args.calls // args.rounds,
                    args.objects // args.rounds,
                    args.tasks,
                )
            )
            gc.collect()
            readings.append(rss_mib())
            print(f"round {r + 1:3d}/{args.rounds}: {done:8d} calls, RSS {readings[-1]:7.1f} MiB")
            sys.stdout.flush()
    warm = readings[args.warmup - 1]
    growth = max(readings[args.warmup :]) - warm
    ok = growth <= args.tolerance_mib
    print(
        f"{done} calls, {args.objects} objects made and dropped, metrics never read, "
        f"{time.perf_counter() - t0:.0f} s: RSS {start:.1f} MiB at start, {warm:.1f} MiB "
        f"after warm-up, {readings[-1]:.1f} MiB at the end; growth after warm-up "
        f"{growth:+.1f} MiB ({'within' if ok else 'OVER'} {args.tolerance_mib} MiB)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
