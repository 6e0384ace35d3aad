"""An owner loop on a dedicated thread (:mod:`loopbridge._loop_thread`): it runs
coroutines on its loop, and its ``stop()`` fails the calls and streams still
waiting on that loop with ``OwnerLoopClosed``.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import loopbridge as lb

from .conftest import make_engine as _make
from .conftest import until_set


def test_loop_thread_run_and_errors() -> None:
    t = lb.LoopThread(name="runner")
    with pytest.raises(lb.LoopAffinityError):
        _ = t.loop  # not started yet
    with t:

        async def add(a: int, b: int) -> int:
            return a + b

        async def runs_on() -> threading.Thread:
            return threading.current_thread()

        assert t.run(add, 2, 3) == 5
        assert t.running
        assert t.run(runs_on) is t.thread is not threading.current_thread()
    assert not t.running
    with pytest.raises(lb.OwnerLoopClosed):
        t.run(add, 1, 1)


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
