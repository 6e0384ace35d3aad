"""Forcing the interleavings of the raw-client failure demonstrations.

``on_other_loop`` runs a coroutine function on a fresh asyncio loop on a fresh
thread, as a Celery task or a Django view under ``async_to_sync`` does, and
returns what it raised (or returned). ``OwnerHeld`` parks the owner loop inside
one of its own steps until released, so a reply from the server cannot be read
by the owner in between: whatever the other loop does with the shared client, it
does while the owner is busy, the interleaving the trackers' reports describe,
every time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import loopbridge

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "recipes"

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


async def cancelled_while(op: Callable[[], Awaitable[Any]], blocked: Callable[[], None]) -> bool:
    """Run ``op``; cancel it once ``blocked()`` (run in a thread) returns, which it
    does when the server shows the operation waiting. True if it was cancelled
    there, not finished."""
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


def example(name: str) -> ModuleType:
    """The recipe in examples/recipes/<name>.py (the code docs/recipes.md shows)."""
    if not hasattr(loopbridge, "Owned"):
        pytest.skip("needs returned loop-bound objects (loopbridge.Owned)")
    module = sys.modules.get(f"recipe_{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"recipe_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module
