"""No silent loss in streams: a stream never consumes from a source it does not own
beyond what its consumer asked for, unless running ahead is declared.

On 3e67832, breaking out of ``async for`` over a websocket-like object (its own
``__aiter__``/``__anext__``) or over a generator that reads a shared queue
dropped the items the pump had read ahead, up to the window; natively the next
``recv()`` gets them.  There was no way to turn it off, and the loss was not
counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import loopbridge as lb
import loopbridge.metrics

N = 50


@lb.loop_affine(read_ahead={"declared": 0})
class Socket:
    """websockets' shape: async-iterable over its own incoming queue, and recv()."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[int] = asyncio.Queue()
        for i in range(N):
            self.incoming.put_nowait(i)

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
            yield await self.incoming.get()


@pytest.fixture
def sock(owner: lb.LoopThread) -> Socket:
    async def make() -> Socket:
        return Socket()

    return owner.run(make)


async def _take_two(stream: Any) -> list[int]:
    it = stream.__aiter__()
    got = [await it.__anext__(), await it.__anext__()]
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
        batched = await _take_two(p.messages())  # default for a generator: batched
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
