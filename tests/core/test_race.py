"""The downstream failure, reproduced deterministically, and prevented by the proxy.

``Engine`` mimics vLLM's ``AsyncLLM``: each request gets a one-slot collector with
an ``asyncio.Event`` (like ``RequestOutputCollector``); an output-handler task on
the owner loop puts results into collectors and sets their events.  If a request
is awaited on a foreign loop, the event's waiter belongs to that loop while
``Event.set()`` runs on the owner's thread.

The hook makes the overlap certain instead of rare: whenever ``Event.set()`` wakes
a waiter that belongs to another loop, it holds the setter until that loop has run
the waiter (which removes itself from the event's waiter deque).  The unsafe path
must then fail with ``deque mutated during iteration`` (killing the output
handler, as in vLLM) or lose wake-ups; the same load through ``proxy`` must pass.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import loopbridge as lb

LOOPS = 8


class Collector:
    def __init__(self) -> None:
        self.output: Any = None
        self.ready = asyncio.Event()

    def put(self, output: Any) -> None:
        self.output = output
        self.ready.set()

    async def get(self) -> Any:
        while self.output is None:
            await self.ready.wait()
        output, self.output = self.output, None
        self.ready.clear()
        return output


@lb.loop_affine
class Engine:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[Collector, int]] = asyncio.Queue()
        self.handler_error: BaseException | None = None
        self.handler = asyncio.get_running_loop().create_task(self._output_handler())

    async def _output_handler(self) -> None:
        try:
            while True:
                collector, value = await self.queue.get()
                await asyncio.sleep(0)  # the "engine step"
                collector.put(value * 2)
        except BaseException as exc:  # vLLM: "output_handler failed", engine dead
            self.handler_error = exc
            raise

    async def request(self, value: int) -> int:
        collector = Collector()
        # The request itself travels safely (vLLM sends it over a socket); only the
        # collector's event is shared between loops.
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (collector, value))
        result: int = await collector.get()
        return result


@pytest.fixture
def overlap_hook() -> Iterator[list[str]]:
    """Hold Event.set() while a waiter of another loop runs."""
    original = asyncio.Event.set
    overlaps: list[str] = []

    def set_and_hold(self: asyncio.Event) -> None:
        if self._value:  # type: ignore[attr-defined]
            return
        self._value = True  # type: ignore[attr-defined]
        here = asyncio._get_running_loop()
        for fut in self._waiters:  # type: ignore[attr-defined]
            if fut.done():
                continue
            fut.set_result(True)
            loop = fut.get_loop()
            if loop is not here and not loop.is_closed():
                overlaps.append("held")
                ran = threading.Event()
                loop.call_soon_threadsafe(ran.set)
                ran.wait(1.0)

    asyncio.Event.set = set_and_hold  # type: ignore[method-assign]
    try:
        yield overlaps
    finally:
        asyncio.Event.set = original  # type: ignore[method-assign]


def _run_foreign_loops(fn: Any, per_loop: int, timeout: float) -> list[Any]:
    """Run ``fn(k, i)`` ``per_loop`` times on each of LOOPS foreign loops."""
    outcomes: list[Any] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        async def main() -> None:
            async def one(i: int) -> Any:
                try:
                    return await asyncio.wait_for(fn(k, i), timeout)
                except BaseException as exc:
                    return exc

            results = await asyncio.gather(*(one(i) for i in range(per_loop)))
            with lock:
                outcomes.extend(results)

        asyncio.run(main())

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(LOOPS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_direct_use_fails_and_proxy_passes(overlap_hook: list[str]) -> None:
    owner = lb.LoopThread(name="engine-owner").start()

    async def make() -> Engine:
        return Engine()

    try:
        # --- unsafe: the object used directly from 8 foreign loops -------------
        raw = owner.run(make)
        old = lb.set_affinity_check("off")  # let the misuse through, as plain asyncio would
        try:
            outcomes = _run_foreign_loops(lambda k, i: raw.request(i), per_loop=20, timeout=2.0)
        finally:
            lb.set_affinity_check(old)
        deque_errors = isinstance(raw.handler_error, RuntimeError) and "deque mutated" in str(
            raw.handler_error
        )
        lost = [o for o in outcomes if isinstance(o, (asyncio.TimeoutError, TimeoutError))]
        assert overlap_hook, "the hook never saw a cross-loop wake-up"
        assert deque_errors or lost, (raw.handler_error, outcomes[:5])
        # It is the vLLM failure mode: the handler died, so requests are lost.
        assert deque_errors, f"expected the output handler to die, got {raw.handler_error!r}"

        # --- safe: the same load through the proxy, thousands of calls ---------
        overlap_hook.clear()
        engine = owner.run(make)
        p = lb.proxy(engine)
        outcomes = _run_foreign_loops(
            lambda k, i: p.request(k * 1000 + i), per_loop=400, timeout=30
        )
        assert len(outcomes) == LOOPS * 400
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        assert not errors, errors[:3]
        expected = sorted(2 * (k * 1000 + i) for k in range(LOOPS) for i in range(400))
        assert sorted(outcomes) == expected
        assert engine.handler_error is None and not engine.handler.done()
        assert not overlap_hook  # every wake-up happened on the owner loop
    finally:
        owner.stop()
