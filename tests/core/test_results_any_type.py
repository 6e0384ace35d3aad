"""Loop-bound results of any type: Futures, Tasks, coroutines, C-typed objects and
classes with their own ``__new__`` cross as proxies by their ``returns=`` rule, or
are refused on first use with ``LoopAffinityError``.

On 3e67832 each of these failed at return with ``TypeError: object.__new__(X) is
not safe``: a proxy (or tripwire) of a class with a C layout was made with
``object.__new__``.  A returned coroutine's first use raised a plain TypeError
(its tripwire had no ``__await__``).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

import anyio
import pytest
import uvloop

import loopbridge as lb


@lb.loop_affine(returns={"ping": lb.Owned(), "task": lb.Owned(), "later": lb.Owned()})
class Socket:
    """websockets' shape: ``ping()`` returns a future the owner resolves later."""

    def __init__(self) -> None:
        self.pongs: list[asyncio.Future[float]] = []

    async def ping(self) -> asyncio.Future[float]:
        fut = asyncio.get_running_loop().create_future()
        self.pongs.append(fut)
        asyncio.get_running_loop().call_soon(fut.set_result, 0.25)  # the pong arrives
        return fut

    async def task(self) -> asyncio.Task[asyncio.AbstractEventLoop]:
        return asyncio.ensure_future(_where())

    async def later(self) -> Any:
        return _where()  # a coroutine, made on the owner, not started

    async def bare_future(self) -> asyncio.Future[int]:  # no rule covers it
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, 5)
        return fut

    async def bare_coroutine(self) -> Any:  # no rule covers it
        return _where()


async def _where() -> asyncio.AbstractEventLoop:
    await asyncio.sleep(0)
    return asyncio.get_running_loop()


@pytest.fixture
def sock(owner: lb.LoopThread) -> Socket:
    async def make() -> Socket:
        return Socket()

    return owner.run(make)


async def _use(p: Socket, owner_loop: asyncio.AbstractEventLoop) -> None:
    fut = await p.ping()
    assert isinstance(fut, asyncio.Future)  # a proxy of the future's own type
    assert not asyncio.isfuture(fut)  # ... but no future of this loop
    assert await fut == 0.25
    if _asyncio():  # asyncio's own helpers take it as an awaitable
        assert await asyncio.gather(await p.ping()) == [0.25]
    assert await (await p.task()) is owner_loop
    assert await (await p.later()) is owner_loop  # the coroutine ran on the owner


def _asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_futures_tasks_and_coroutines_cross_by_their_rule(
    owner: lb.LoopThread, sock: Socket
) -> None:
    p = lb.proxy(sock)
    asyncio.run(_use(p, owner.loop))
    uvloop.run(_use(p, owner.loop))
    anyio.run(_use, p, owner.loop, backend="trio")


def test_a_future_from_a_plain_thread(owner: lb.LoopThread, sock: Socket) -> None:
    b = lb.blocking(lb.proxy(sock))
    assert lb.blocking(b.ping()).result() == 0.25
    assert lb.blocking(b.task()).result() is owner.loop
    assert lb.blocking(b.later()).result() is owner.loop


async def _uncovered(p: Socket, owner_loop: asyncio.AbstractEventLoop) -> None:
    fut = await p.bare_future()
    with pytest.raises(lb.LoopAffinityError, match=r"bare_future.*returns=\{'bare_future'"):
        fut.result()  # any use but awaiting: refused, naming the rule
    with pytest.raises(lb.LoopAffinityError, match="bare_future"):
        fut.add_done_callback(print)
    assert await fut == 5  # awaiting it: on its owner
    coro = await p.bare_coroutine()
    with pytest.raises(lb.LoopAffinityError, match=r"returns=\{'bare_coroutine'"):
        coro.send(None)
    assert await coro is owner_loop  # awaited: run on the owner


def test_uncovered_awaitables_are_awaited_on_the_owner_and_refused_otherwise(
    owner: lb.LoopThread, sock: Socket
) -> None:
    p = lb.proxy(sock)
    asyncio.run(_uncovered(p, owner.loop))
    uvloop.run(_uncovered(p, owner.loop))
    anyio.run(_uncovered, p, owner.loop, backend="trio")
    fut = lb.blocking(p).bare_future()
    assert lb.blocking(fut).result() == 5

    async def gathered() -> list[int]:
        return await asyncio.gather(await p.bare_future())

    assert asyncio.run(gathered()) == [5]


def test_adopted_futures_and_c_typed_objects_get_a_proxy(owner: lb.LoopThread) -> None:
    async def make() -> tuple[asyncio.Future[int], collections.deque[int]]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        fut.set_result(3)
        return lb.adopt(fut), lb.adopt(collections.deque([1, 2]))

    fut, dq = owner.run(make)
    pf, pd = lb.proxy(fut), lb.proxy(dq)
    assert isinstance(pf, asyncio.Future) and isinstance(pd, collections.deque)

    async def main() -> int:
        return await pf  # type: ignore[no-any-return]

    assert asyncio.run(main()) == 3
    with pytest.raises(lb.LoopAffinityError, match=r"deque\.__len__"):
        len(pd)  # never the proxy's own empty deque's answer
    with pytest.raises(lb.LoopAffinityError, match=r"deque\.append"):
        pd.append(3)


class Tag(str):
    """A builtin subclass with its own ``__new__`` that needs an argument."""

    made = 0

    def __new__(cls, value: str) -> Tag:
        cls.made += 1
        return super().__new__(cls, value)

    async def upper(self) -> str:
        return str.upper(self)


class Pair(tuple):  # type: ignore[type-arg]
    """Variable-size C layout: takes no ``__slots__``."""

    async def first(self) -> Any:
        return self[0]


def test_classes_with_their_own_new_and_variable_size_layouts(owner: lb.LoopThread) -> None:
    async def make() -> tuple[Tag, Pair]:
        return lb.adopt(Tag("ab")), lb.adopt(Pair((1, 2)))

    tag, pair = owner.run(make)
    made = Tag.made
    pt, pp = lb.proxy(tag), lb.proxy(pair)
    assert Tag.made == made  # the proxy never runs the class's own __new__
    assert isinstance(pt, Tag) and isinstance(pp, Pair)

    async def main() -> tuple[str, Any]:
        return await pt.upper(), await pp.first()

    assert asyncio.run(main()) == ("AB", 1)
    with pytest.raises(lb.LoopAffinityError, match=r"__len__"):
        len(pp)


def test_a_future_the_owner_resolves_later_wakes_the_caller(
    owner: lb.LoopThread,
) -> None:
    """websockets' ping(): the pong arrives on the owner after the caller awaits."""
    resolve = threading.Event()

    @lb.loop_affine(returns={"ping": lb.Owned()})
    class Slow:
        async def ping(self) -> asyncio.Future[str]:
            fut = asyncio.get_running_loop().create_future()

            async def pong() -> None:
                await asyncio.to_thread(resolve.wait, 30)
                fut.set_result("pong")

            self.pong_task = asyncio.ensure_future(pong())
            return fut

    async def make() -> Slow:
        return Slow()

    p = lb.proxy(owner.run(make))

    async def main() -> str:
        waiter = await p.ping()
        task = asyncio.ensure_future(waiter)  # awaited through __await__, on the owner
        await asyncio.sleep(0)
        assert not task.done()
        resolve.set()
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(main()) == "pong"
