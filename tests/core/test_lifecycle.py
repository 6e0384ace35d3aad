"""Owner death: pending calls and streams fail promptly with OwnerLoopClosed."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import loopbridge as lb

from .conftest import Engine


async def _make() -> Engine:
    return Engine()


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_loop_thread_stop_fails_pending_calls_and_streams(kind: str) -> None:
    owner = lb.LoopThread(use_uvloop=kind == "uvloop").start()
    p = lb.proxy(owner.run(_make))

    async def main() -> None:
        call = asyncio.create_task(p.sleep(30))
        stream = p.count(10**9, delay=0.5)

        async def consume() -> None:
            async for _ in stream:
                pass

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        threading.Thread(target=owner.stop).start()
        with pytest.raises(lb.OwnerLoopClosed):
            await call
        with pytest.raises(lb.OwnerLoopClosed):
            await consumer
        assert time.monotonic() - t0 < 2.0
        t1 = time.monotonic()
        with pytest.raises(lb.OwnerLoopClosed):
            await p.echo(1)  # new calls fail at once
        assert time.monotonic() - t1 < 0.5

    asyncio.run(main())


def test_asyncio_run_owner_returning_fails_pending_calls() -> None:
    box: dict[str, object] = {}
    ready = threading.Event()
    release = threading.Event()

    def owner_main() -> None:
        async def main() -> None:
            box["engine"] = Engine()
            ready.set()
            while not release.is_set():
                await asyncio.sleep(0.01)

        asyncio.run(main())

    t = threading.Thread(target=owner_main)
    t.start()
    ready.wait()
    p = lb.proxy(box["engine"])

    async def main() -> None:
        call = asyncio.create_task(p.sleep(30))
        await asyncio.sleep(0.05)
        release.set()  # asyncio.run returns: tasks cancelled, loop closed
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
        await asyncio.sleep(0.05)
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
    b = lb.blocking(owner.run(_make))
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            b.sleep(30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    time.sleep(0.1)
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
