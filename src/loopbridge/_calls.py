"""One call of an async member, carried from a caller to the owner loop and back.

Data path for a caller on loop B and an owner on loop A::

    B: create a future, put the call into A's port ........ (one wake of A per batch)
    A: start a Task running the member in a copy of B's context
    A: on completion, put the outcome into B's port ........ (one wake of B per batch)
    B: resolve the future; the awaiting task resumes

Cancellation crosses both ways.  If the caller is cancelled, the owner task is
cancelled with the same message and the caller waits up to ``cancel_grace``
seconds for the owner's cleanup to finish before re-raising.  If the owner task
is cancelled by someone else, the caller receives ``CancelledError``; if it was
cancelled because its loop is shutting down, the caller receives
:class:`~loopbridge.OwnerLoopClosed`.

Three kinds of callers share everything but how they wait, which is their
waker (:mod:`loopbridge._wakers`): asyncio loops (uvloop included), trio runs,
and plain threads (the blocking face).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from ._eager import NATIVE_EAGER
from ._errors import LoopAffinityError
from ._operation import Operation, Options, chain, check_block
from ._outcome import CANCELLED, OK
from ._ownership import on_owner_thread
from ._ports import PORT_ATTR, Port, get_running_loop, running_port
from ._returns import PLAIN
from ._trio import in_trio_run, trio_port
from ._wakers import LoopWaker, TrioWaker, new_loop_waker, thread_waker, trio_waker

__all__ = [
    "Call",
    "route_call",
    "route_exit",
    "call_from_async",
    "call_from_thread",
    "cancel_message",
]

_perf = time.perf_counter


class Call(Operation):
    """A call in flight."""

    __slots__ = ()

    kind = "call"
    always_woken = True  # the caller always waits for its one outcome
    steps_without_task = not NATIVE_EAGER

    def count_give_up(self) -> None:
        self.opts.metrics.cancelled()

    async def body(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            result = await self.fn(*self.args, **self.kwargs)
            if type(result) not in PLAIN and self.opts.shape is not None:
                # Still on the owner: a result that is the object itself, another
                # loop-affine object, or holds loop-bound state (see _returns).
                result = self.opts.shape(self, result)
        except BaseException as exc:
            if self.raised_on_owner(exc, loop):
                raise
        else:
            self.settle(OK, result)


def _returned(call: Call, t_return: float) -> Any:
    # A call the owner side cancelled has no return latency: the caller resumes
    # through a cancel, as if it had been cancelled itself.
    outcome = call.outcome
    call.opts.metrics.returned(call, t_return if outcome is not CANCELLED else 0.0)
    return call.value if outcome is OK else call.raise_outcome()


# ------------------------------------------------------------ the three callers
def route_call(
    opts: Options,
    loop: asyncio.AbstractEventLoop | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    finish: bool = False,
) -> Any:
    """An awaitable for a call made off the owner loop, from ``loop`` (the running one).

    ``finish``: the caller's cancel does not cancel the call (see ``route_exit``).
    """
    if loop is None:
        # No loop yet (the coroutine was made before asyncio.run, or under
        # trio): decide when it is awaited.
        return _route_on_await(opts, fn, args, kwargs, what, finish)
    # loop_waker's common case, to save its frame on every call: the two
    # statements are its own (tests/core/test_one_definition.py compares them).
    port = getattr(loop, PORT_ATTR, None)
    if port is None or port.dead is not None or (waker := port.waker) is None:
        waker = new_loop_waker(loop)
    return call_from_async(waker, opts, fn, args, kwargs, what, finish)


#: How an ``__aexit__`` is routed.  Natively an exit starts at once, even in a
#: cancelled scope, and its cleanup (often shielded: a pool's release, a
#: subscription's close) finishes.  Through the proxy a cancelled caller would
#: otherwise cancel it before it starts on the owner, and the cleanup would be
#: lost.  So the caller's cancel leaves it running to completion on the owner;
#: the caller waits for it up to ``cancel_grace``, then its cancel goes on.
route_exit = functools.partial(route_call, finish=True)


async def _route_on_await(
    opts: Options,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    finish: bool,
) -> Any:
    loop = get_running_loop()
    if loop is not None:
        if loop is opts.ownership.owner.loop:
            return await fn(*args, **kwargs)
        return await route_call(opts, loop, fn, args, kwargs, what, finish)
    if in_trio_run():
        return await call_from_async(trio_waker(trio_port()), opts, fn, args, kwargs, what, finish)
    raise LoopAffinityError(f"awaiting {what} through a proxy needs a running asyncio loop or trio")


async def call_from_async(
    waker: LoopWaker | TrioWaker,
    opts: Options,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    description: str,
    finish: bool = False,
) -> Any:
    """Run ``fn(*args, **kwargs)`` on the owner loop; await it from the waker's
    asyncio loop or trio run.  ``finish``: see ``route_exit``.

    The call is made when this coroutine first runs, not when it is created,
    so it carries the context (and submission site) of whoever awaits it, as a
    native coroutine would.
    """
    call = Call(fn, args, kwargs, description, opts, waker)
    # Armed before it is submitted: its wake is posted to this loop or run, so
    # it runs on this thread after the caller parks.
    call.waiter = waker.new_waiter()
    call.submit()
    try:
        await waker.park(call)
    except waker.cancelled as exc:
        waker.unpark(call)
        if finish:
            await _outlasts_cancel(call, waker)
        else:
            await _cancelled_by_caller(call, waker, cancel_message(exc))
        raise
    waker.unpark(call)
    return _returned(call, _perf())


def call_from_thread(call: Call, timeout: float | None = None) -> Any:
    """Blocking face: run ``call`` on the owner loop, block this thread only.

    ``timeout``: give up after that many seconds (``TimeoutError``) and cancel
    the owner side.  On the thread of a running loop, a wait that closes a cycle
    of blocked owner threads is refused (see ``check_block`` in :mod:`loopbridge._operation`).
    """
    opts = call.opts
    if on_owner_thread(opts.ownership):
        raise LoopAffinityError(
            f"blocking {call.description} on the owner loop's own thread would deadlock: "
            "await loopbridge.proxy(obj) instead"
        )
    loop = get_running_loop()  # on a plain thread (the common case), no port to look for
    here = None if loop is None else running_port(loop)
    if here is not None:
        held = _block_loop(call, here)
    try:
        waker = call.waker = thread_waker()
        call.waiter = waker.new_waiter()
        call.submit()
        try:
            waker.park(call, timeout)
        except BaseException:  # KeyboardInterrupt, a timeout: cancel the owner side
            if call.caller_gives_up(None):
                waker.wait_settled(call, opts.grace)
            opts.metrics.returned(call, 0.0)
            raise
        return _returned(call, _perf())
    finally:
        if here is not None:
            here.blocked = held


def _block_loop(call: Call, here: Port) -> object:
    """This thread runs ``here``'s loop, which the blocking ``call`` blocks too:
    refuse a wait that closes a cycle, then mark the loop blocked on ``call``
    (its wakes are sent at once from now on).  Returns what it was blocked on."""
    check_block(call, call.opts.ownership.port(), here)
    call.ctx.run(chain.set, (*chain.get(), call))  # its work is part of this wait
    held, here.blocked = here.blocked, call
    here.flush_deferred()
    return held


def cancel_message(exc: BaseException) -> str | None:
    """The message a caller's cancel carries to the owner side (trio's carry none)."""
    return exc.args[0] if isinstance(exc, asyncio.CancelledError) and exc.args else None


async def _outlasts_cancel(call: Call, waker: LoopWaker | TrioWaker) -> None:
    """The caller was cancelled during a call that must finish: leave it running
    on the owner and wait for it, cancel-proof, up to ``cancel_grace``."""
    opts = call.opts
    await waker.wait_settled(call, opts.grace)
    opts.metrics.returned(call, 0.0)  # the caller resumes through its cancel


async def _cancelled_by_caller(call: Call, waker: LoopWaker | TrioWaker, msg: str | None) -> None:
    """The caller was cancelled: cancel the owner task, wait boundedly for cleanup."""
    opts = call.opts
    if call.caller_gives_up(msg):
        await waker.wait_settled(call, opts.grace)
    opts.metrics.returned(call, 0.0)  # admission and run, but no return: it was cancelled
