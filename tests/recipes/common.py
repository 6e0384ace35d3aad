"""What every recipe's tests do with a client: many callers at once, from each
kind of caller, and cancellation that reaches the server."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


def from_threads(fn: Callable[[int], T], n: int, workers: int = 16) -> list[T]:
    """``fn(i)`` for ``i < n`` on a pool of plain threads, results in order."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, range(n)))


async def concurrently(fn: Callable[[int], Awaitable[T]], n: int) -> list[T]:
    """``await fn(i)`` for ``i < n``, all at once, on whatever loop runs this (anyio:
    asyncio, uvloop or trio)."""
    results: list[Any] = [None] * n

    async def one(i: int) -> None:
        results[i] = await fn(i)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return results


async def cancel_when(started: threading.Event, aw: Callable[[], Awaitable[Any]]) -> None:
    """Run ``aw()`` and cancel it once ``started`` is set (by the server: the request
    got there).  Waits for the event in a worker thread, bounded."""

    async def cancel_once_started(scope: anyio.CancelScope) -> None:
        assert await anyio.to_thread.run_sync(started.wait, 30), "the server never saw it"
        scope.cancel()

    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_once_started, scope)
            await aw()
            raise AssertionError("the call returned although the server never answers")
    assert scope.cancelled_caught
