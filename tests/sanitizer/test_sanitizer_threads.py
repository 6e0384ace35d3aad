"""The sanitizer runs in the threads it watches: it must stay correct when
many threads trip it at once, and when it is switched on and off while loops
are busy in other threads."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from sanitizer_support import LoopInThread, skip_if_installed_for_session

from loopbridge import sanitizer
from loopbridge.sanitizer import sanitize


def test_concurrent_misuse_from_many_threads_is_counted_exactly() -> None:
    threads, per_thread = 8, 50
    with LoopInThread("owner") as owner, sanitize("log") as block:
        futures: list[asyncio.Future[int]] = owner.call(
            lambda: [owner.loop.create_future() for _ in range(threads * per_thread)]
        )
        start = threading.Barrier(threads)
        errors: list[BaseException] = []

        def hammer(k: int) -> None:
            try:
                start.wait()
                for fut in futures[k * per_thread : (k + 1) * per_thread]:
                    fut.set_result(k)
            except BaseException as exc:  # anything the sanitizer lets escape
                errors.append(exc)

        workers = [threading.Thread(target=hammer, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        assert errors == []
        assert len(block.reports) == threads * per_thread
        assert all(r.operation == "asyncio.Future.set_result" for r in block.reports)
        # one offending line, counted once per occurrence
        assert len({r.key() for r in block.reports}) == 1
        assert sanitizer._report.emitter.seen[block.reports[0].key()] == threads * per_thread
        owner.call(lambda: None)


async def _busy(rounds: int) -> int:
    q: asyncio.Queue[int] = asyncio.Queue(maxsize=4)
    ev = asyncio.Event()
    lock = asyncio.Lock()
    total = 0

    async def prod() -> None:
        for i in range(rounds):
            await q.put(i)
        ev.set()

    async def cons() -> None:
        nonlocal total
        for _ in range(rounds):
            v = await q.get()
            async with lock:
                total += v
            await asyncio.sleep(0)

    await asyncio.gather(prod(), cons(), ev.wait())
    return total


def test_switching_on_and_off_while_loops_run() -> None:
    skip_if_installed_for_session()
    rounds = 3000
    results: list[Any] = []
    with LoopInThread("w1") as w1, LoopInThread("w2") as w2, LoopInThread("w3") as w3:
        pending = [lt.submit(_busy(rounds)) for lt in (w1, w2, w3)]
        seen: list[int] = []
        while not all(p.done() for p in pending):
            with sanitize("raise") as block:
                threading.Event().wait(0.001)
            seen.append(len(block.reports))
        results = [p.result(30) for p in pending]
    assert results == [sum(range(rounds))] * 3
    assert sum(seen) == 0
    assert len(seen) > 1, "the loops finished before the sanitizer was toggled"
    assert not sanitizer._instrument.patched()
