"""A sync member's loop-bound result, made on the owner when first used
(:mod:`loopbridge._pending`): awaited, entered or iterated there, each call made
once; iterated and left early, it is cancelled there only if it is an operation in
flight, never a business object with a ``cancel()`` of its own.

The fakes have the shapes of the real clients: a stub whose attributes are
callables that give awaitable and async-iterable calls (grpc.aio), and a shop whose
orders have a ``cancel()`` of their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import loopbridge as lb
from loopbridge import Owned


# ------------------------------------------------------------ grpc-shaped stubs
class Call:
    """Awaitable and async-iterable, started on the loop it is made on (grpc.aio)."""

    def __init__(self, n: int) -> None:
        self._loop = asyncio.get_running_loop()
        self.n = n
        self.was_cancelled = False

    def __await__(self) -> Any:
        return self._result().__await__()

    async def _result(self) -> int:
        assert asyncio.get_running_loop() is self._loop
        return self.n * 10

    def __aiter__(self) -> AsyncIterator[int]:
        return self._items()

    async def _items(self) -> AsyncIterator[int]:
        assert asyncio.get_running_loop() is self._loop
        for i in range(self.n):
            yield i

    # The future protocol, as grpc.aio's calls have it: an operation in flight.
    def cancel(self) -> bool:
        assert asyncio.get_running_loop() is self._loop
        self.was_cancelled = True
        return True

    def cancelled(self) -> bool:
        return self.was_cancelled

    def done(self) -> bool:
        return self.was_cancelled

    def add_done_callback(self, fn: Any) -> None:
        raise NotImplementedError


class MultiCallable:
    def __init__(self) -> None:
        self.calls = 0
        self.made: list[Call] = []

    def __call__(self, n: int) -> Call:
        self.calls += 1
        self.made.append(Call(n))
        return self.made[-1]


class Stub:
    def __init__(self) -> None:
        self.method = MultiCallable()  # an instance attribute, like a generated stub's


CALLABLE = Owned(returns={"__call__": Owned()})


def test_stub_attributes_callables_and_calls(owner: lb.LoopThread) -> None:
    async def make() -> Stub:
        return lb.adopt(Stub(), returns={"method": CALLABLE})

    stub = owner.run(make)
    p = lb.proxy(stub)

    async def main() -> None:
        assert isinstance(p.method, MultiCallable) and lb.is_proxy(p.method)
        assert await p.method(4) == 40
        assert [i async for i in p.method(3)] == [0, 1, 2]

    asyncio.run(main())
    anyio.run(main, backend="trio")
    b = lb.blocking(p)
    assert b.method(5).result() == 50
    assert list(b.method(2)) == [0, 1]
    assert stub.method.calls == 6  # each call made once, on the owner
    assert not any(call.was_cancelled for call in stub.method.made)  # all ran to the end


def test_a_call_iterated_and_left_early_is_cancelled_on_the_owner(owner: lb.LoopThread) -> None:
    async def make() -> Stub:
        return lb.adopt(Stub(), returns={"method": CALLABLE})

    stub = owner.run(make)
    p = lb.proxy(stub)

    async def main() -> None:
        it = p.method(10**6).__aiter__()
        assert await it.__anext__() == 0
        await it.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    with iter(lb.blocking(p).method(10**6)) as items:  # type: ignore[attr-defined]
        assert next(items) == 0
    with (
        pytest.raises(TypeError, match="gave a Call object, which is not an async context"),
        lb.blocking(p).method(1),
    ):
        pass
    assert [call.was_cancelled for call in stub.method.made] == [True, True, False]


class Order:
    """A business object with a ``cancel()`` of its own, iterable for its lines."""

    def __init__(self) -> None:
        self.cancelled_by: list[str] = []

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:  # longer than any read-ahead: the consumer leaves early
            yield "tea"

    def cancel(self) -> None:
        self.cancelled_by.append("loopbridge")


class Shop:
    def __init__(self) -> None:
        self.orders: list[Order] = []

    def order(self) -> Order:
        self.orders.append(Order())
        return self.orders[-1]


def test_leaving_early_never_calls_a_business_objects_cancel(owner: lb.LoopThread) -> None:
    """On 3e67832 a break out of `async for` over a pending result called the
    object's cancel() whatever it was: an order was cancelled."""

    async def make() -> Shop:
        return lb.adopt(Shop(), returns={"order": Owned()})

    shop = owner.run(make)
    p = lb.proxy(shop)

    async def main() -> None:
        lines = p.order().__aiter__()
        assert await lines.__anext__() == "tea"
        await lines.aclose()  # type: ignore[attr-defined]  # waits for the owner's cleanup

    asyncio.run(main())
    with iter(lb.blocking(p).order()) as lines:  # type: ignore[attr-defined]
        assert next(lines) == "tea"  # leaving the block waits for the owner's cleanup

    async def cancelled() -> list[list[str]]:
        return [o.cancelled_by for o in shop.orders]

    assert owner.run(cancelled) == [[], []]
