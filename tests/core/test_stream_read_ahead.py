"""An object's own async iteration reads nothing ahead, however ``__aiter__`` is written.

Iterating a proxied object (``async for m in p``, ``p.__aiter__()``, or its blocking
face's ``for``) runs the object's own ``__aiter__`` on the owner.  The object stays
in use after the consumer leaves (a websocket's next ``recv()``), so the stream
takes one item from it per item asked for.  That holds for an ``__aiter__`` that
returns ``self`` (with an ``async def __anext__``) and for one that is an async
generator function (websockets' connections): both are the object's iteration.

An async generator *method* is different: each call makes a fresh generator that
belongs to the stream alone, so it keeps the batched path (up to the window
ahead), unless declared otherwise.

On 45500bb an async generator ``__aiter__`` took the batched path: a ``break``
after ``k`` items left the next ``recv()`` with an item far past ``k``.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import loopbridge as lb
import loopbridge.metrics
from loopbridge._members import MemberKind, classify
from loopbridge._ownership import ownership_of

N = 40
#: Items each round takes before breaking out; the round then recv()s one.
ROUNDS = (1, 3, 2, 5)


class _Source:
    """A queue every item is already in: anything read ahead is read at once."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[int] = asyncio.Queue()
        for i in range(N):
            self.incoming.put_nowait(i)

    async def recv(self) -> int:
        return await self.incoming.get()

    async def left(self) -> int:
        return self.incoming.qsize()

    async def fresh(self, n: int) -> AsyncIterator[int]:
        """A generator method: its generator is the stream's own."""
        for i in range(n):
            yield i


@lb.loop_affine
class GenIter(_Source):
    """websockets' shape: ``__aiter__`` is an async generator function."""

    async def __aiter__(self) -> AsyncIterator[int]:
        while True:
            yield await self.recv()


@lb.loop_affine
class SelfIter(_Source):
    """The classic shape: ``__aiter__`` returns self, ``__anext__`` is async."""

    def __aiter__(self) -> SelfIter:
        return self

    async def __anext__(self) -> int:
        return await self.recv()


@lb.loop_affine(read_ahead={"__aiter__": None})
class DeclaredBatched(GenIter):
    """Running ahead, declared: the object's iteration batched again."""

    def __init__(self) -> None:
        super().__init__()
        self.ran_ahead = threading.Event()  # set once item 1 is taken off the source

    async def __aiter__(self) -> AsyncIterator[int]:
        while True:
            item = await self.recv()
            if item >= 1:
                self.ran_ahead.set()  # no await before the yield: the pump holds it next
            yield item


SHAPES = [GenIter, SelfIter]


def _make(owner: lb.LoopThread, cls: type) -> Any:
    async def make() -> Any:
        return cls()

    return owner.run(make)


def _expected() -> list[tuple[list[int], int]]:
    out, n = [], 0
    for k in ROUNDS:
        out.append((list(range(n, n + k)), n + k))
        n += k + 1
    return out


async def _rounds(p: Any) -> list[tuple[list[int], int]]:
    out = []
    for k in ROUNDS:
        got: list[int] = []
        async for m in p:
            got.append(m)
            if len(got) == k:
                break
        out.append((got, await p.recv()))
    return out


async def _rounds_explicit(p: Any) -> list[tuple[list[int], int]]:
    """``p.__aiter__()`` by hand, closed with ``aclose()``."""
    out = []
    for k in ROUNDS:
        it = p.__aiter__()
        got = [await it.__anext__() for _ in range(k)]
        await it.aclose()
        out.append((got, await p.recv()))
    return out


def _rounds_blocking(p: Any) -> list[tuple[list[int], int]]:
    b = lb.blocking(p)
    out = []
    for k in ROUNDS:
        got: list[int] = []
        for m in b:
            got.append(m)
            if len(got) == k:
                break
        out.append((got, b.recv()))
    return out


def _run_trio(fn: Callable[[Any], Any], p: Any) -> Any:
    trio = pytest.importorskip("trio")
    return trio.run(fn, p)


CALLERS: dict[str, Callable[[Any], Any]] = {
    "asyncio": lambda p: asyncio.run(_rounds(p)),
    "explicit": lambda p: asyncio.run(_rounds_explicit(p)),
    "trio": lambda p: _run_trio(_rounds, p),
    "thread": _rounds_blocking,
}


@pytest.mark.parametrize("cls", SHAPES, ids=lambda c: c.__name__)
def test_iteration_is_classified_as_the_objects_own(owner: lb.LoopThread, cls: type) -> None:
    ownership = ownership_of(_make(owner, cls))
    assert ownership is not None
    kinds = classify(cls, ownership)
    assert kinds["__aiter__"][0] is MemberKind.ITERATION  # one item per request
    assert kinds["fresh"][0] is MemberKind.STREAM  # a generator method: batched


@pytest.mark.parametrize("window", [1, 256])
@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("cls", SHAPES, ids=lambda c: c.__name__)
def test_break_then_recv_gets_the_next_item(
    owner: lb.LoopThread, cls: type, caller: str, window: int
) -> None:
    obj = _make(owner, cls)
    p = lb.proxy(obj, stream_window=window)
    assert CALLERS[caller](p) == _expected()
    gc.collect()
    taken = sum(k + 1 for k in ROUNDS)
    assert lb.blocking(p).left() == N - taken  # nothing else left the source
    assert lb.metrics.metrics_of(p).snapshot()["stream_items_unread"] == 0


@pytest.mark.parametrize("cls", SHAPES, ids=lambda c: c.__name__)
def test_on_the_owner_loop_iteration_is_the_objects_own(owner: lb.LoopThread, cls: type) -> None:
    obj = _make(owner, cls)
    p = lb.proxy(obj)

    async def on_owner() -> list[tuple[list[int], int]]:
        return await _rounds(p)

    assert owner.run(on_owner) == _expected()


def test_declared_read_ahead_batches_the_objects_iteration(owner: lb.LoopThread) -> None:
    """``read_ahead={"__aiter__": None}`` runs ahead again, and counts what it lost."""
    obj = _make(owner, DeclaredBatched)
    p = lb.proxy(obj, stream_window=256)

    async def main() -> int:
        it = p.__aiter__()
        assert await it.__anext__() == 0
        assert await asyncio.to_thread(obj.ran_ahead.wait, 30)  # the owner ran ahead
        await it.aclose()  # waits for the owner side, which counts what it read ahead
        left: int = await p.left()
        return left

    left = asyncio.run(main())
    unread = lb.metrics.metrics_of(p).snapshot()["stream_items_unread"]
    assert unread > 0  # it ran ahead, as declared
    assert 1 + unread + left == N  # every item taken off the source is handed out or counted
