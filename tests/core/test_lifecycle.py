"""Owner death: pending calls and streams fail promptly with OwnerLoopClosed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import loopbridge as lb
from loopbridge._ownership import ownership_of

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


class SteppedOwner:
    """An owner loop run in rounds on one thread (``run_forever`` until stopped, then
    again when resumed), as a loop driven by repeated ``run_until_complete`` is."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopped = threading.Event()
        self._resume = threading.Event()
        self._quit = False
        self.thread = threading.Thread(target=self._main, name="stepped-owner")

        async def make() -> Engine:
            return Engine()

        self.engine = self.loop.run_until_complete(make())
        self.thread.start()

    def _main(self) -> None:
        while True:
            self.loop.run_forever()
            self.stopped.set()
            if self._quit:
                return
            assert self._resume.wait(30)
            self._resume.clear()
            self.stopped.clear()

    def stop(self, quit: bool = False) -> None:
        self._quit = quit
        self.loop.call_soon_threadsafe(self.loop.stop)
        assert self.stopped.wait(30)

    def resume(self) -> None:
        self._resume.set()


def test_a_stopped_owner_is_not_dead_calls_run_when_it_runs_again() -> None:
    owner = SteppedOwner()
    p = lb.proxy(owner.engine)
    b = lb.blocking(p)
    assert b.echo(1) == 1  # the owner's port exists and has run
    ownership = ownership_of(owner.engine)
    assert ownership is not None
    port = ownership.port()
    owner.stop()
    done = threading.Event()

    async def main() -> Any:
        call = asyncio.create_task(p.echo(2))
        await asyncio.sleep(0)  # submitted: waits for a loop that is only stopped
        # What the waiting caller's liveness checks do, as many times as they like:
        # a stopped loop whose thread lives is not dead (it was after two checks).
        for _ in range(5):
            assert await asyncio.to_thread(port.check_alive)
        assert not call.done()
        done.set()
        owner.resume()
        return await call

    assert asyncio.run(main()) == 2
    assert done.is_set()
    owner.stop(quit=True)
    owner.thread.join(30)
    # Stopped, and the thread that ran it has ended: now it is dead.
    with pytest.raises(lb.OwnerLoopClosed):
        b.echo(3)
    owner.loop.close()
    with pytest.raises(lb.OwnerLoopClosed):
        b.echo(4)


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
