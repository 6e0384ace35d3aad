"""What threads blocked in long calls cost while they wait.

N plain threads each make one blocking call (``lb.blocking(p).wait()``) that
the owner loop answers only at the end, as workers waiting on long generations
do.  While they wait, the script measures the process's CPU time and its
context switches over a few seconds of wall time: what waiting costs the
process, and the owner loop beside it.  Nothing else runs in the process.

    python benchmarks/bench_idle_waiters.py --threads 16 64 --seconds 3

To compare two trees, run it with each tree's ``src`` first on ``PYTHONPATH``
(the output names the tree it imported).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import threading
import time
from pathlib import Path

import loopbridge as lb


@lb.loop_affine
class Gate:
    """A call that returns when the gate opens."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def wait(self) -> int:
        await self.opened.wait()
        return 1


async def _make() -> Gate:
    return Gate()


def _parked(thread: threading.Thread) -> bool:
    """Whether ``thread`` waits in a blocking call (its stack)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "wait" and "_wakers" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def measure(n: int, seconds: float) -> dict[str, float]:
    """CPU (per cent of one core) and context switches per second while ``n`` wait."""
    with lb.LoopThread(name="owner", use_uvloop=False) as owner:
        gate = owner.run(_make)
        face = lb.blocking(lb.proxy(gate))
        threads = [threading.Thread(target=face.wait, name=f"waiter-{i}") for i in range(n)]
        for t in threads:
            t.start()
        pause = threading.Event()
        while not all(_parked(t) for t in threads):
            pause.wait(0.01)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        c0, w0 = time.process_time(), time.perf_counter()
        pause.wait(seconds)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        owner.run(gate.opened.set)
        for t in threads:
            t.join()
    switches = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw)
    return {
        "threads": n,
        "cpu_percent_of_a_core": round(cpu / wall * 100, 2),
        "context_switches_per_s": round(switches / wall),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    tree = Path(lb.__file__).resolve().parents[2]
    for n in args.threads:
        row = measure(n, args.seconds)
        print(json.dumps({"tree": tree.name, **row}))


if __name__ == "__main__":
    main()
