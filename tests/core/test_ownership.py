"""Ownership records (:mod:`loopbridge._ownership`): who owns an object now, and the
one "is this thread running the owner loop?" test.

``transfer`` swaps the record: an unbound object gets its owner, calls submitted
before a transfer follow it to the new owner, and a dead owner's object is revived.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import loopbridge as lb
import loopbridge.metrics
from loopbridge import _ownership

from .conftest import Adder, Engine
from .conftest import make_engine as _make


def test_unbound_object_and_transfer(asyncio_owner: lb.LoopThread) -> None:
    e = Engine("late")  # no running loop: no owner yet
    assert lb.owner_loop(e) is None
    p = lb.proxy(e)

    async def main() -> None:
        with pytest.raises(lb.LoopAffinityError, match="transfer"):
            await p.echo(1)

    asyncio.run(main())
    lb.transfer(e, asyncio_owner.loop)
    assert lb.owner_loop(e) is asyncio_owner.loop

    async def again() -> None:
        assert await p.where() is asyncio_owner.loop

    asyncio.run(again())


@pytest.fixture
def owners_a_b() -> Iterator[tuple[lb.LoopThread, lb.LoopThread]]:
    a = lb.LoopThread(name="owner-a").start()
    b = lb.LoopThread(name="owner-b").start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


async def _queued_across_a_transfer(
    a: lb.LoopThread, b: lb.LoopThread, n: int
) -> tuple[Engine, list[asyncio.Task[asyncio.AbstractEventLoop]], threading.Event]:
    """``n`` calls of an object of A's queued on A, held busy, then the object moved
    to B.  Returns its proxy, the calls, and the event that lets A go on."""
    e = a.run(_make)
    p = lb.proxy(e)
    gate = threading.Event()
    a.loop.call_soon_threadsafe(gate.wait)
    calls = [asyncio.ensure_future(p.where()) for _ in range(n)]
    await asyncio.sleep(0)  # one turn of this loop: every task submits its call
    assert lb.metrics.metrics_of(p).snapshot()["calls_in_flight"] == n
    lb.transfer(e, b.loop)
    return p, calls, gate


def test_transfer_with_calls_in_flight_loses_and_misroutes_nothing(
    owners_a_b: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = owners_a_b

    async def main() -> None:
        p, calls, gate = await _queued_across_a_transfer(a, b, 50)
        gate.set()
        loops = await asyncio.gather(*calls)
        # Queued calls were re-routed: every one ran on B, the new owner.
        assert all(loop is b.loop for loop in loops)
        assert await p.where() is b.loop
        # A re-routed call is counted once: 51 submitted, each settled once.
        snap = lb.metrics.metrics_of(p).snapshot()
        assert (snap["calls"], snap["ok"], snap["calls_in_flight"]) == (51, 51, 0)

    asyncio.run(main())


def test_call_rerouted_to_a_dead_owner_fails_typed_and_is_counted_once(
    owners_a_b: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    """The re-route's failure path: the call waits in the old owner's queue while
    the object moves to a new owner that then stops.  The caller gets
    ``OwnerLoopClosed``, and the call is counted once, as one error."""
    a, b = owners_a_b

    async def main() -> None:
        p, (call,), gate = await _queued_across_a_transfer(a, b, 1)
        b.stop()
        gate.set()
        with pytest.raises(lb.OwnerLoopClosed, match=r"owner loop of .* is gone"):
            await asyncio.wait_for(call, 20)
        snap = lb.metrics.metrics_of(p).snapshot()
        assert (snap["calls"], snap["errors"], snap["calls_in_flight"]) == (1, 1, 0)

    asyncio.run(main())


def test_on_owner_thread(owner: lb.LoopThread) -> None:
    async def make() -> Adder:
        return Adder()

    adder = owner.run(make)
    ownership = _ownership.ownership_of(adder)
    assert ownership is not None

    async def ask() -> bool:
        return _ownership.on_owner_thread(ownership)

    assert owner.run(ask) is True  # the owner loop's own thread
    assert asyncio.run(ask()) is False  # another loop
    assert _ownership.on_owner_thread(ownership) is False  # a plain thread

    unbound = Adder()  # made while no loop runs: no owner yet
    own_none = _ownership.ownership_of(unbound)
    assert own_none is not None and own_none.loop is None
    assert _ownership.on_owner_thread(own_none) is False
    assert asyncio.run(ask_none(own_none)) is False


async def ask_none(ownership: Any) -> bool:
    return _ownership.on_owner_thread(ownership)


def test_transfer_revives_an_object_whose_owner_died() -> None:
    first = lb.LoopThread().start()
    e = first.run(_make)
    first.stop()
    p = lb.proxy(e)

    async def main() -> None:
        with pytest.raises(lb.OwnerLoopClosed):
            await p.echo(1)

    asyncio.run(main())
    with lb.LoopThread() as second:
        lb.transfer(e, second.loop)
        assert lb.blocking(p).where() is second.loop
    with pytest.raises(lb.OwnerLoopClosed):
        lb.transfer(e, second.loop)
