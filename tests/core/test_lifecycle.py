"""Owner death: pending calls and streams fail promptly with OwnerLoopClosed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import loopbridge as lb

from .conftest import Engine, until_set


async def _make() -> Engine:
    return Engine()


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_loop_thread_stop_fails_pending_calls_and_streams(kind: str) -> None:
    owner = lb.LoopThread(use_uvloop=kind == "uvloop").start()
    engine = owner.run(_make)
    p = lb.proxy(engine)

    async def main() -> None:
        call = asyncio.create_task(p.sleep(30))
        stream = p.count(10**9, delay=30)

        async def consume() -> None:
            async for _ in stream:
                pass

        consumer = asyncio.create_task(consume())
        await until_set(engine.started["sleep"])
        await until_set(engine.started["count"])
        stopper = threading.Thread(target=owner.stop)
        stopper.start()
        # Both fail long before the owner side would have finished (30 s).
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(call, 25)
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(consumer, 25)
        with pytest.raises(lb.OwnerLoopClosed):
            await p.echo(1)  # new calls fail too
        stopper.join()

    asyncio.run(main())


def test_asyncio_run_owner_returning_fails_pending_calls() -> None:
    box: dict[str, Any] = {}
    ready = threading.Event()

    def owner_main() -> None:
        async def main() -> None:
            box["engine"] = Engine()
            box["loop"] = asyncio.get_running_loop()
            box["release"] = release = asyncio.Event()
            ready.set()
            await release.wait()

        asyncio.run(main())

    t = threading.Thread(target=owner_main)
    t.start()
    ready.wait()
    p = lb.proxy(box["engine"])

    async def main() -> None:
        call = asyncio.create_task(p.sleep(30))
        await until_set(box["engine"].started["sleep"])
        # asyncio.run returns: tasks cancelled, loop closed
        box["loop"].call_soon_threadsafe(box["release"].set)
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(call, 5)

    asyncio.run(main())
    t.join()


def test_stop_without_cancel_is_detected() -> None:
    """A loop stopped with loop.stop() (tasks left pending) is noticed by callers."""
    loop = asyncio.new_event_loop()
    holder: dict[str, Engine] = {}

    async def make() -> None:
        holder["e"] = Engine()

    loop.run_until_complete(make())
    t = threading.Thread(target=loop.run_forever)
    t.start()
    p = lb.proxy(holder["e"])
    blocked = lb.blocking(p)

    async def main() -> None:
        call = asyncio.create_task(p.sleep(30))
        await until_set(holder["e"].started["sleep"])
        loop.call_soon_threadsafe(loop.stop)
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(call, 5)

    asyncio.run(main())
    t.join()
    with pytest.raises(lb.OwnerLoopClosed):
        blocked.echo(1)
    loop.close()
    with pytest.raises(lb.OwnerLoopClosed):
        blocked.echo(1)


def test_blocking_caller_sees_owner_death() -> None:
    owner = lb.LoopThread().start()
    engine = owner.run(_make)
    b = lb.blocking(engine)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            b.sleep(30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    assert engine.started["sleep"].wait(30)
    owner.stop()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], lb.OwnerLoopClosed)


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
