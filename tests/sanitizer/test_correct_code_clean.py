"""Correct cross-thread and cross-loop code produces no reports."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sanitizer_support import LoopInThread, in_thread

from loopbridge.sanitizer import sanitize

LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
}
try:
    import uvloop

    LOOP_FACTORIES["uvloop"] = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is a test dependency
    pass


async def same_loop_workload() -> int:
    """Every primitive, used the asyncio way, on one loop."""
    q: asyncio.Queue[int] = asyncio.Queue(maxsize=2)
    ev = asyncio.Event()
    lock = asyncio.Lock()
    sem = asyncio.Semaphore(2)
    cond = asyncio.Condition()
    total = 0

    async def producer() -> None:
        for i in range(50):
            await q.put(i)
        await q.join()
        ev.set()

    async def consumer() -> None:
        nonlocal total
        while True:
            item = await q.get()
            async with lock, sem:
                total += item
            q.task_done()

    async def notifier() -> None:
        await ev.wait()
        async with cond:
            cond.notify_all()

    async def cond_waiter() -> None:
        async with cond:
            await cond.wait_for(ev.is_set)

    consumers = [asyncio.create_task(consumer()) for _ in range(3)]
    if sys.version_info >= (3, 11):
        async with asyncio.TaskGroup() as tg:
            tg.create_task(producer())
            tg.create_task(cond_waiter())
            tg.create_task(notifier())
    else:  # no TaskGroup before 3.11
        await asyncio.gather(producer(), cond_waiter(), notifier())
    for c in consumers:
        c.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    try:
        await asyncio.wait_for(asyncio.sleep(1), 0.01)
    except asyncio.TimeoutError:  # an alias of TimeoutError from 3.11
        pass
    if sys.version_info >= (3, 11):  # asyncio.timeout is new in 3.11
        async with asyncio.timeout(1):
            await asyncio.sleep(0)
    total += await asyncio.to_thread(lambda: 1000)
    total += await asyncio.get_running_loop().run_in_executor(None, lambda: 1000)
    return total


@pytest.mark.parametrize("kind", sorted(LOOP_FACTORIES))
def test_same_loop_primitives_clean(kind: str) -> None:
    with sanitize("raise") as block, LoopInThread("owner", LOOP_FACTORIES[kind]) as owner:
        assert owner.run(same_loop_workload(), timeout=20) == sum(range(50)) + 2000
    assert block.reports == []


@pytest.mark.parametrize("kind", sorted(LOOP_FACTORIES))
def test_threadsafe_handoffs_clean(kind: str) -> None:
    """call_soon_threadsafe and run_coroutine_threadsafe from plain threads and
    from other loops."""
    with (
        sanitize("raise") as block,
        LoopInThread("owner", LOOP_FACTORIES[kind]) as owner,
        LoopInThread("client", LOOP_FACTORIES[kind]) as client,
    ):
        loop = owner.loop
        fut: asyncio.Future[int] = owner.call(loop.create_future)
        ev: asyncio.Event = owner.call(asyncio.Event)
        q: asyncio.Queue[int] = owner.call(asyncio.Queue)
        lock: asyncio.Lock = owner.call(asyncio.Lock)

        async def result_of(f: asyncio.Future[int]) -> int:
            return await f

        waits = [owner.submit(ev.wait()), owner.submit(q.get()), owner.submit(result_of(fut))]
        owner.call(lambda: None)

        def from_plain_thread() -> int:
            loop.call_soon_threadsafe(fut.set_result, 7)
            loop.call_soon_threadsafe(ev.set)
            loop.call_soon_threadsafe(q.put_nowait, 8)
            # the coroutine is created here and runs on the owner loop
            asyncio.run_coroutine_threadsafe(lock.acquire(), loop).result(5)
            asyncio.run_coroutine_threadsafe(q.put(9), loop).result(5)
            return asyncio.run_coroutine_threadsafe(q.get(), loop).result(5)

        assert in_thread(from_plain_thread) == 9
        assert [w.result(5) for w in waits] == [True, 8, 7]  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(lock.release)

        async def from_other_loop() -> int:
            cf = asyncio.run_coroutine_threadsafe(asyncio.sleep(0, 5), loop)
            value = await asyncio.wrap_future(cf)
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            mine = asyncio.get_running_loop()
            loop.call_soon_threadsafe(lambda: mine.call_soon_threadsafe(done.set_result, value + 1))
            return await done

        assert client.run(from_other_loop()) == 6
        # a cancelled cross-loop call: cancellation travels via the
        # concurrent future's callbacks, not by touching the task directly
        cf = asyncio.run_coroutine_threadsafe(asyncio.sleep(30), loop)
        cf.cancel()
        with pytest.raises(BaseException):
            cf.result(5)
        owner.call(lambda: None)
    assert block.reports == []


def test_sequential_reuse_of_unbound_primitives_clean() -> None:
    """asyncio lets a primitive that never had a waiter move between loops run
    one after another (a module-level lock across asyncio.run calls)."""
    lock = asyncio.Lock()
    ev = asyncio.Event()
    q: asyncio.Queue[int] = asyncio.Queue()

    async def use() -> None:
        async with lock:
            q.put_nowait(1)
            q.get_nowait()
            ev.set()
            ev.clear()

    with sanitize("raise") as block:
        for _ in range(3):
            asyncio.run(use())
        in_thread(lambda: asyncio.run(use()))
    assert block.reports == []


def test_janus_queue_clean() -> None:
    """A real thread/async queue library that hands off with call_soon_threadsafe."""
    janus = pytest.importorskip("janus")

    async def main() -> list[int]:
        queue: Any = janus.Queue()

        def produce() -> None:
            for i in range(20):
                queue.sync_q.put(i)

        producer = asyncio.get_running_loop().run_in_executor(None, produce)
        got = [await queue.async_q.get() for _ in range(20)]
        await producer
        queue.close()
        await queue.wait_closed()
        return got

    with sanitize("raise") as block:
        assert asyncio.run(main()) == list(range(20))
    assert block.reports == []


def test_set_up_before_the_loop_runs_clean() -> None:
    """Scheduling onto a loop that is not running (yet) is allowed, also from
    a thread that runs another loop."""
    with sanitize("raise") as block:
        loop = asyncio.new_event_loop()
        try:
            hits: list[int] = []

            async def elsewhere() -> None:
                loop.call_soon(hits.append, 1)
                loop.call_later(0, hits.append, 2)

            asyncio.run(elsewhere())
            loop.call_soon(loop.stop)
            done = threading.Event()

            def run() -> None:
                loop.run_forever()
                done.set()

            threading.Thread(target=run).start()
            assert done.wait(5)
            assert hits == [1, 2]
        finally:
            loop.close()
    assert block.reports == []
