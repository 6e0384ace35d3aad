"""A function called on a loop the adapters do not run, through loopbridge's own crossing.

An adapter reaches the engine's owner loop the way its users reach the engine: through
a proxy of an object that loop owns (loopbridge's one doorway), never with
``run_coroutine_threadsafe`` or ``call_soon_threadsafe`` of its own. :func:`arun_on`
(from another loop) and :func:`run_on` (from a plain thread) bind a fresh
:class:`LoopCall` to the loop with :func:`loopbridge.transfer` and call its one member
there; a :class:`loopbridge.LoopThread` of the adapter's own is reached with its
``run``/``arun`` instead.

Invariants: the function runs on the loop's thread, in a task of that loop (its result
awaited there when it is awaitable), so what it starts belongs to that loop; it is
refused on that loop itself (loopbridge's refusal: the call needs no crossing); a call
the loop has not started when it closes fails with :class:`loopbridge.OwnerLoopClosed`;
cancelling the caller (or the timeout of :func:`run_on`) takes back a call not yet
started and cancels one that has; the result comes back as loopbridge brings back any
result (a plain value, not something that belongs to the loop).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from loopbridge import blocking, loop_affine, proxy, transfer

__all__ = ["arun_on", "run_on"]

T = TypeVar("T")


@loop_affine
class LoopCall:
    """Calls a function on the loop that owns it (its metrics say ``LoopCall object``)."""

    async def call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return result


def _bound(loop: asyncio.AbstractEventLoop) -> LoopCall:
    hands = LoopCall()
    transfer(hands, loop)
    return proxy(hands)


@overload
async def arun_on(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Awaitable[T]], *args: Any
) -> T: ...
@overload
async def arun_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any) -> T: ...
async def arun_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` called on ``loop`` (awaited there if awaitable), awaited from another loop."""
    return await _bound(loop).call(fn, args)


@overload
def run_on(
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    timeout: float | None = None,
) -> T: ...
@overload
def run_on(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., T], *args: Any, timeout: float | None = None
) -> T: ...
def run_on(
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float | None = None,
) -> Any:
    """:func:`arun_on` from a plain thread, blocking it for at most ``timeout`` seconds
    (:class:`TimeoutError` then, and ``fn`` is taken back or cancelled)."""
    return blocking(_bound(loop), timeout=timeout).call(fn, args)
