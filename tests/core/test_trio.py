"""Callers under trio (:mod:`loopbridge._trio`), through anyio's trio backend: a
trio cancel reaches the owner side, and the owner side runs as asyncio whatever
the caller runs.  Calls and streams from trio and asyncio alike are in
test_foreign_runtimes.py.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import anyio
import pytest

import loopbridge as lb

from .conftest import Engine


def test_trio_cancellation_reaches_the_owner(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine)

    async def cancel_once(started: threading.Event, scope: anyio.CancelScope) -> None:
        # Polled (with a deadline): a worker thread would outlive the test in
        # trio's thread cache.
        deadline = anyio.current_time() + 30
        while not started.is_set():
            assert anyio.current_time() < deadline, "the owner side never started"
            await anyio.sleep(0.001)
        scope.cancel()

    async def main() -> None:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once, engine.started["sleep"], scope)
                await p.sleep(30)
        assert scope.cancel_called
        # The owner task was cancelled and its cleanup finished before we went on.
        assert engine.log[0][0] == "cancelled"
        assert engine.log[1][0] == "cleanup done"
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once, engine.started["count"], scope)
                async for _ in p.count(10**9, delay=0.001):
                    pass
        assert ("finally", owner.loop) in engine.log

    anyio.run(main, backend="trio")


def test_owner_side_runs_as_asyncio_for_a_trio_caller(owner: lb.LoopThread) -> None:
    """The caller's context crosses, but not trio's sniffio marker: libraries that
    pick their backend with sniffio (httpx, anyio) must see asyncio on the owner."""
    sniffio = pytest.importorskip("sniffio", reason="sniffio comes with anyio, in the test group")

    @lb.loop_affine
    class Which:
        async def library(self) -> str:
            return str(sniffio.current_async_library())

        async def libraries(self) -> AsyncIterator[str]:
            yield str(sniffio.current_async_library())

    async def make() -> Which:
        return Which()

    p = lb.proxy(owner.run(make))

    async def main() -> None:
        assert sniffio.current_async_library() == "trio"
        assert await p.library() == "asyncio"
        assert [x async for x in p.libraries()] == ["asyncio"]
        assert sniffio.current_async_library() == "trio"  # the caller's is untouched

    anyio.run(main, backend="trio")
