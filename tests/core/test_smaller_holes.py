"""Smaller holes found by a demanding new user (issue 33, point 10).

Each failed on 3e67832: the affinity error printed two identical loop reprs;
``blocking(blocking(p))`` said "decorate its class with @loop_affine"; a fresh
``Queue``/``Event`` (``_loop`` still ``None``) crossed unchecked and bound to
the caller's loop; async classmethods and staticmethods ran on the caller's loop
with the proxy class as ``cls``.  KeyboardInterrupt/SystemExit in an owner
method stop the owner loop, as in asyncio: now documented and pinned here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

import loopbridge as lb


@lb.loop_affine
class Service:
    registry: ClassVar[list[tuple[str, asyncio.AbstractEventLoop]]] = []

    async def get(self) -> int:
        return 1

    async def fresh_queue(self) -> asyncio.Queue[int]:
        return asyncio.Queue()

    async def fresh_event_holder(self) -> Any:
        return Holder()

    @classmethod
    async def register(cls, name: str) -> tuple[type, asyncio.AbstractEventLoop]:
        cls.registry.append((name, asyncio.get_running_loop()))
        return cls, asyncio.get_running_loop()

    @staticmethod
    async def version() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    @classmethod
    async def names(cls) -> AsyncIterator[tuple[type, asyncio.AbstractEventLoop]]:
        yield cls, asyncio.get_running_loop()

    async def exit(self) -> None:
        raise SystemExit(3)


class Holder:
    def __init__(self) -> None:
        self.ready = asyncio.Event()  # not bound to any loop until first used


@pytest.fixture
def service(owner: lb.LoopThread) -> Service:
    async def make() -> Service:
        return Service()

    return owner.run(make)


def test_the_affinity_error_tells_the_two_loops_apart(
    owner: lb.LoopThread, service: Service
) -> None:
    async def main() -> str:
        with pytest.raises(lb.LoopAffinityError) as info:
            await service.get()
        return str(info.value)

    msg = asyncio.run(main())
    assert f"on thread {threading.current_thread().name!r} (id {threading.get_ident()})" in msg
    assert f"on thread {owner.name!r}" in msg
    assert f"0x{id(owner.loop):x}" in msg


def test_blocking_of_a_blocking_face_is_that_face(service: Service) -> None:
    b = lb.blocking(lb.proxy(service))
    assert lb.blocking(b) is b
    assert lb.blocking(b).get() == 1


def test_a_fresh_queue_or_event_is_caught_before_it_binds_to_the_callers_loop(
    service: Service,
) -> None:
    p = lb.proxy(service)

    async def main() -> None:
        q = await p.fresh_queue()
        with pytest.raises(lb.LoopAffinityError, match=r"fresh_queue.*first loop that uses it"):
            q.put_nowait(1)
        holder = await p.fresh_event_holder()
        with pytest.raises(lb.LoopAffinityError, match=r"attribute 'ready'"):
            holder.ready  # noqa: B018

    asyncio.run(main())


def test_async_classmethods_and_staticmethods_run_on_the_owner(
    owner: lb.LoopThread, service: Service
) -> None:
    p = lb.proxy(service)

    async def main() -> None:
        cls, ran_on = await p.register("a")
        assert cls is Service and ran_on is owner.loop  # never the proxy class
        assert await p.version() is owner.loop
        assert [x async for x in p.names()] == [(Service, owner.loop)]

    asyncio.run(main())
    assert lb.blocking(p).register("b") == (Service, owner.loop)
    assert Service.registry[-2:] == [("a", owner.loop), ("b", owner.loop)]


# The owner's thread ends with the SystemExit: that is the behaviour pinned here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_system_exit_in_an_owner_method_stops_the_owner_loop(owner: lb.LoopThread) -> None:
    """As in asyncio: the exception reaches the caller, and it also propagates out of
    the owner loop, which stops; its callers then get OwnerLoopClosed."""

    async def make() -> Service:
        return Service()

    p = lb.proxy(owner.run(make))

    async def main() -> None:
        with pytest.raises(SystemExit):
            await p.exit()
        await asyncio.to_thread(owner._thread.join, 30)  # type: ignore[union-attr]
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(p.get(), 30)

    asyncio.run(main())
    assert not owner.running
