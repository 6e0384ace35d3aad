"""Async generators across loops (:mod:`loopbridge._streams`): order, back-pressure,
batching, closing on the owner, and reading ahead only as far as declared."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import loopbridge as lb
import loopbridge.metrics

from .conftest import Engine, tasks_on, until_set


def test_items_flow_in_order(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        items = [i async for i in p.count(10_000)]
        assert items == list(range(10_000))

    asyncio.run(main())
    assert engine.log == [("finally", owner.loop)]


@pytest.mark.parametrize("how", ["break", "aclose", "cancel"])
def test_consumer_exit_closes_the_generator_on_the_owner_loop(
    owner: lb.LoopThread, engine: Engine, how: str
) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        if how == "break":
            async for i in p.count(10**9, delay=0.001):
                if i == 3:
                    break
            gc.collect()
            # Dropping the stream closes the generator without waiting for it.
            await until_set(engine.count_finished)
        elif how == "aclose":
            stream = p.count(10**9, delay=0.001)
            assert await stream.__anext__() == 0
            await stream.aclose()
            # aclose() waits for the owner-side cleanup.
            assert ("finally", owner.loop) in engine.log
        else:
            got_one = asyncio.Event()

            async def consume() -> None:
                async for _ in p.count(10**9, delay=0.001):
                    got_one.set()

            task = asyncio.create_task(consume())
            await got_one.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert ("finally", owner.loop) in engine.log

    asyncio.run(main())
    # The generator's own handlers and finally ran, on the owner loop.
    assert ("finally", owner.loop) in engine.log
    assert all(entry[-1] is owner.loop for entry in engine.log)
    assert not tasks_on(owner.loop)


@lb.loop_affine
class Producer:
    """Counts what it has produced, so that tests can see how far ahead it is."""

    def __init__(self) -> None:
        self.produced = 0

    async def items(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            self.produced = i + 1
            yield i

    async def progress(self) -> int:
        return self.produced


async def _make_producer() -> Producer:
    return Producer()


async def _until_produced(p: Producer, at_least: int) -> None:
    """Poll (each probe is a round trip through the owner loop) with a deadline."""
    deadline = time.monotonic() + 60
    while await p.progress() < at_least:
        assert time.monotonic() < deadline, f"the producer never reached {at_least} items"


def test_backpressure_suspends_the_producer(asyncio_owner: lb.LoopThread) -> None:
    p = lb.proxy(asyncio_owner.run(_make_producer), stream_window=32)

    async def main() -> None:
        stream = p.items(10_000)
        assert await stream.__anext__() == 0
        # The consumer stays idle: the producer fills the window...
        await _until_produced(p, 32)
        # ...and stays there, however many owner-loop turns it gets; a producer
        # that ignored the window would keep going here.
        for _ in range(20):
            ahead = await p.progress()
            assert ahead <= 32 + 1, ahead
        rest = [i async for i in stream]
        assert rest == list(range(1, 10_000))

    asyncio.run(main())


def test_items_are_handed_over_in_batches(asyncio_owner: lb.LoopThread) -> None:
    window, total = 4096, 50_000
    p = lb.proxy(asyncio_owner.run(_make_producer), stream_window=window)
    metrics = lb.metrics.metrics_of(p)

    async def main() -> None:
        n = 0
        async for _ in p.items(total):
            n += 1
            if n % 1000 == 0:
                # A busy consumer: items pile up (a quarter window) before it goes on.
                await _until_produced(p, min(total, n + window // 4))
        assert n == total

    asyncio.run(main())
    snap = metrics.snapshot()
    # One wake-up per batch, never one per item.
    assert snap["stream_batches"] < total / 20, snap
    assert snap["items_per_wakeup"] > 20


def test_generator_error_arrives_after_the_items(owner: lb.LoopThread) -> None:
    @lb.loop_affine
    class Broken:
        async def items(self) -> AsyncIterator[int]:
            yield 1
            yield 2
            raise KeyError("gone")

    async def make() -> Broken:
        return Broken()

    p = lb.proxy(owner.run(make))

    async def main() -> None:
        got = []
        with pytest.raises(KeyError) as info:
            async for i in p.items():
                got.append(i)
        assert got == [1, 2]
        assert any("Broken.items()" in n for n in info.value.__notes__)

    asyncio.run(main())


def test_many_concurrent_streams(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine, stream_window=16)

    async def one(k: int) -> int:
        return sum([i async for i in p.count(500 + k)])

    async def main() -> None:
        totals = await asyncio.gather(*(one(k) for k in range(40)))
        assert totals == [sum(range(500 + k)) for k in range(40)]

    asyncio.run(main())
    assert not tasks_on(owner.loop)


def test_unstarted_stream_costs_nothing_and_closes_cleanly(engine: Engine) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        stream = p.count(5)
        await stream.aclose()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()

    asyncio.run(main())
    assert engine.log == []  # the generator never started


def test_asend_and_window_validation(engine: Engine) -> None:
    with pytest.raises(ValueError):
        lb.proxy(engine, stream_window=0)
    p = lb.proxy(engine)

    async def main() -> None:
        stream = p.count(3)
        assert await stream.asend(None) == 0
        with pytest.raises(TypeError):
            await stream.asend(5)  # type: ignore[arg-type]
        await stream.aclose()

    asyncio.run(main())


# ----------------------------------------------------------------- reading ahead
# No silent loss in streams: a stream never consumes from a source it does not own
# beyond what its consumer asked for, unless running ahead is declared.
#
# On 3e67832, breaking out of ``async for`` over a websocket-like object (its own
# ``__aiter__``/``__anext__``) or over a generator that reads a shared queue
# dropped the items the pump had read ahead, up to the window; natively the next
# ``recv()`` gets them.  There was no way to turn it off, and the loss was not
# counted.
N = 50
#: The item a batched stream holds once it has read one past the two a test takes.
READ_AHEAD_MARK = 5


@lb.loop_affine(read_ahead={"declared": 0})
class Socket:
    """websockets' shape: async-iterable over its own incoming queue, and recv()."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[int] = asyncio.Queue()
        for i in range(N):
            self.incoming.put_nowait(i)
        # Set once messages() has taken READ_AHEAD_MARK off the queue: a test's hook.
        self.took_mark = threading.Event()

    def __aiter__(self) -> Socket:
        return self

    async def __anext__(self) -> int:
        return await self.incoming.get()

    async def recv(self) -> int:
        return await self.incoming.get()

    async def left(self) -> int:
        return self.incoming.qsize()

    async def declared(self) -> AsyncIterator[int]:  # reads the shared queue: read_ahead=0
        while True:
            yield await self.incoming.get()

    async def messages(self) -> AsyncIterator[int]:  # undeclared: batched
        while True:
            item = await self.incoming.get()
            if item == READ_AHEAD_MARK:
                self.took_mark.set()
            yield item


@pytest.fixture
def sock(owner: lb.LoopThread) -> Socket:
    async def make() -> Socket:
        return Socket()

    return owner.run(make)


async def _take_two(stream: Any, before_close: threading.Event | None = None) -> list[int]:
    it = stream.__aiter__()
    got = [await it.__anext__(), await it.__anext__()]
    if before_close is not None:
        await until_set(before_close)
    await it.aclose()  # waits for the owner side to stop
    return got


def test_breaking_out_of_an_objects_own_iteration_loses_nothing(sock: Socket) -> None:
    p = lb.proxy(sock)

    async def main() -> tuple[list[int], int, int]:
        got = await _take_two(p)
        return got, await p.recv(), await p.left()

    assert asyncio.run(main()) == ([0, 1], 2, N - 3)  # the next recv() gets the next one


def test_a_generator_member_declared_not_to_read_ahead_loses_nothing(sock: Socket) -> None:
    p = lb.proxy(sock)

    async def main() -> tuple[list[int], int]:
        return await _take_two(p.declared()), await p.recv()

    assert asyncio.run(main()) == ([0, 1], 2)
    with lb.blocking(p).declared() as items:  # the blocking face follows the declaration
        assert [next(items), next(items)] == [3, 4]
    assert lb.blocking(p).recv() == 5


def test_per_call_read_ahead_and_the_count_of_what_was_lost(sock: Socket) -> None:
    p = lb.proxy(sock, stream_window=8)

    async def main() -> tuple[list[int], int, list[int], int]:
        exact = await _take_two(lb.read_ahead(p.messages(), 0))  # this call: none ahead
        after_exact = await p.recv()
        # Default for a generator: batched. Closed once it has read an item ahead.
        batched = await _take_two(p.messages(), before_close=sock.took_mark)
        return exact, after_exact, batched, await p.left()

    exact, after_exact, batched, left = asyncio.run(main())
    assert (exact, after_exact, batched) == ([0, 1], 2, [3, 4])
    lost = N - 5 - left  # read ahead by the batched stream and never delivered
    assert 0 < lost <= 8  # at most the window
    assert loopbridge.metrics.metrics_of(p).snapshot()["stream_items_unread"] == lost


def test_read_ahead_checks_its_arguments(sock: Socket) -> None:
    p = lb.proxy(sock)
    with pytest.raises(ValueError, match="0 or more"):
        lb.read_ahead(p.messages(), -1)
    with pytest.raises(TypeError, match="read_ahead"):
        lb.read_ahead([1, 2], 0)
    with pytest.raises(ValueError, match="0 or more items"):
        lb.loop_affine(read_ahead={"x": -2})
