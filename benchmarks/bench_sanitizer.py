"""Slowdown of an asyncio-heavy workload under the loopbridge sanitizer.

Many task pairs ping-pong through asyncio.Queue, asyncio.Event, asyncio.Lock
and futures (every hand-off creates waiter futures and wakes them, which is
what the sanitizer instruments). Off and on runs are interleaved so drift in
machine load hits both alike; the figure is the median of per-pair ratios.

    python benchmarks/bench_sanitizer.py                 # asyncio loop
    python benchmarks/bench_sanitizer.py --loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable

from loopbridge.sanitizer import sanitize


async def ping_pong(pairs: int, rounds: int) -> int:
    """``pairs`` pairs of tasks; each round: queue hand-off one way, event
    hand-off back, a lock taken on each side, a future resolved."""
    loop = asyncio.get_running_loop()
    done = 0

    async def pair() -> None:
        nonlocal done
        q: asyncio.Queue[asyncio.Future[int]] = asyncio.Queue(maxsize=1)
        back = asyncio.Event()
        lock = asyncio.Lock()

        async def ping() -> None:
            for i in range(rounds):
                fut = loop.create_future()
                await q.put(fut)
                async with lock:
                    pass
                await back.wait()
                back.clear()
                assert await fut == i

        async def pong() -> None:
            for i in range(rounds):
                fut = await q.get()
                async with lock:
                    fut.set_result(i)
                back.set()
                await asyncio.sleep(0)

        await asyncio.gather(ping(), pong())
        done += rounds

    await asyncio.gather(*(pair() for _ in range(pairs)))
    return done


def run_once(new_loop: Callable[[], asyncio.AbstractEventLoop], pairs: int, rounds: int) -> float:
    loop = new_loop()
    try:
        t0 = time.perf_counter()
        assert loop.run_until_complete(ping_pong(pairs, rounds)) == pairs * rounds
        return time.perf_counter() - t0
    finally:
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    if args.loop == "uvloop":
        import uvloop

        new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop

    run_once(new_loop, args.pairs, args.rounds // 4)  # warm-up, both modes
    with sanitize("raise"):
        run_once(new_loop, args.pairs, args.rounds // 4)

    off: list[float] = []
    on: list[float] = []
    for _ in range(args.reps):
        off.append(run_once(new_loop, args.pairs, args.rounds))
        with sanitize("raise") as block:  # patching happens outside the timed run
            on.append(run_once(new_loop, args.pairs, args.rounds))
        assert block.reports == []
    ratios = sorted(b / a for a, b in zip(off, on))
    hand_offs = args.pairs * args.rounds
    result = {
        "loop": args.loop,
        "pairs": args.pairs,
        "rounds": args.rounds,
        "reps": args.reps,
        "off_median_s": statistics.median(off),
        "on_median_s": statistics.median(on),
        "median_ratio": statistics.median(ratios),
        "ratio_min": ratios[0],
        "ratio_max": ratios[-1],
        "off_us_per_round": statistics.median(off) / hand_offs * 1e6,
        "on_us_per_round": statistics.median(on) / hand_offs * 1e6,
    }
    print(f"{args.loop}: {hand_offs} ping-pong rounds, {args.reps} interleaved reps")
    print(
        f"  off {result['off_median_s']:.3f} s ({result['off_us_per_round']:.1f} us/round)"
        f"   on {result['on_median_s']:.3f} s ({result['on_us_per_round']:.1f} us/round)"
    )
    print(
        f"  slowdown: median ratio {result['median_ratio']:.2f}x "
        f"(range {result['ratio_min']:.2f}-{result['ratio_max']:.2f})"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
