"""The callers of the recipes' tests, and the interleavings they force.

``on_other_loop`` runs a coroutine function on a fresh asyncio loop on a fresh
thread, as a Celery task or a Django view under ``async_to_sync`` does, and
returns what it raised (or returned). ``OwnerHeld`` parks the owner loop inside
one of its own steps until released, so a reply from the server cannot be read
by the owner in between: whatever the other loop does with the shared client, it
does while the owner is busy, the interleaving the trackers' reports describe,
every time.

``run_caller`` runs the recipe's side on a new asyncio, uvloop or trio (through
anyio) loop; ``cancelled_midway`` cancels an operation once the server shows it
waiting, by ``Task.cancel()`` or by a cancel scope.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

WAIT = 30.0  # bound on every wait, so a broken demonstration fails instead of hanging


def on_other_loop(fn: Callable[[], Awaitable[Any]]) -> Any:
    """``asyncio.run(fn())`` on a new thread; its result, or the exception it raised."""
    out: list[Any] = []

    def main() -> None:
        async def run() -> Any:
            return await fn()

        try:
            out.append(asyncio.run(run()))
        except BaseException as e:  # the demonstration's outcome, examined by the test
            out.append(e)

    t = threading.Thread(target=main, name="other-loop")
    t.start()
    t.join(WAIT)
    assert not t.is_alive(), "the other loop's call hung"
    return out[0]


class OwnerHeld:
    """Parks the owner loop, then runs ``then()`` on it as soon as it is released.

    ``then`` (a coroutine function, or None) starts in the same loop step that the
    release ends, before the owner can read anything from its sockets: the first
    thing the owner does with the client after the other loop touched it.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, then: Callable[[], Awaitable[Any]] | None = None
    ) -> None:
        self._held = threading.Event()
        self._release = threading.Event()
        self._then = then
        self._future = asyncio.run_coroutine_threadsafe(self._park(), loop)
        assert self._held.wait(WAIT), "the owner loop never ran the hold"

    async def _park(self) -> Any:
        self._held.set()
        self._release.wait(WAIT)  # blocks the owner loop on purpose
        return None if self._then is None else await self._then()

    def release(self) -> Any:
        """Let the owner go on; the result (or exception) of ``then``."""
        self._release.set()
        try:
            return self._future.result(WAIT)
        except Exception as e:
            return e


# ---------------------------------------------------------------- the callers
CALLERS = ("asyncio", "uvloop", "trio")


def run_caller(kind: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """``fn(*args)`` on a new event loop of ``kind`` on this thread (trio through anyio)."""
    import anyio

    if kind == "trio":
        return anyio.run(fn, *args, backend="trio")
    options = {"use_uvloop": kind == "uvloop"}
    return anyio.run(fn, *args, backend="asyncio", backend_options=options)


# How a caller is cancelled: "task" is asyncio's Task.cancel() (delivered once);
# "scope" is an anyio cancel scope (asyncio, uvloop) or trio's own, which cancel
# every await inside the scope, the cleanup's included.
CANCELS = (("task", "asyncio"), ("task", "uvloop"), ("scope", "asyncio"), ("scope", "uvloop"))
CANCELS += (("scope", "trio"),)


# Cleanup that a returned async context manager's __aexit__ runs on the owner
# (asyncpg's pool release, redis-py's pub/sub close) must survive a cancelled
# scope: natively __aexit__ starts and its shielded cleanup completes, and the
# proxy runs an exit to completion on the owner whatever the caller's cancel.
def cancel_params() -> list[Any]:
    """CANCELS as pytest params."""
    return [pytest.param(style, kind, id=f"{style}-{kind}") for style, kind in CANCELS]


def cancelled_midway(
    style: str, kind: str, op: Callable[[], Awaitable[Any]], blocked: Callable[[], None]
) -> bool:
    """Run ``op`` on a new ``kind`` loop; cancel it the ``style`` way once
    ``blocked()`` (run in a thread) returns, which it does when the server shows the
    operation waiting. True if it was cancelled there, not finished."""
    if style == "scope":
        return bool(run_caller(kind, _scope_cancelled, op, blocked))
    return bool(run_caller(kind, _task_cancelled, op, blocked))


async def _task_cancelled(op: Callable[[], Awaitable[Any]], blocked: Callable[[], None]) -> bool:
    async def run() -> None:
        await op()

    task = asyncio.ensure_future(run())
    await asyncio.to_thread(blocked)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def _scope_cancelled(op: Callable[[], Awaitable[Any]], blocked: Callable[[], None]) -> bool:
    import anyio

    finished = False
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await anyio.to_thread.run_sync(blocked)
                scope.cancel()

            tg.start_soon(watch)
            await op()
            finished = True
    return scope.cancelled_caught and not finished
