"""One call of an async member, carried from a caller to the owner loop and back.

Data path for a caller on loop B and an owner on loop A::

    B: create a future, put the call into A's port ........ (one wake of A per batch)
    A: start a Task running the member in a copy of B's context
    A: on completion, put the outcome into B's port ........ (one wake of B per batch)
    B: resolve the future; the awaiting task resumes

Cancellation crosses both ways.  If the caller is cancelled (or its blocking
call times out), a call the owner has not started is taken back, and never
starts there (``Operation.caller_gives_up``); a started one's owner task is
cancelled with the same message, and the caller waits for that cleanup up to
``cancel_grace`` seconds, and only while the owner loop answers at all
(``_wakers.wait_settled``), before re-raising.  If the owner task is cancelled
by someone else, the caller receives ``CancelledError``; if it was cancelled
because its loop is shutting down, the caller receives
:class:`~loopbridge.OwnerLoopClosed`.

The cancellation contract: a result that completed is never silently dropped.
When the caller's cancel races a call that settled OK (before the cancel, or
during the cleanup wait), the caller gets the value and the cancel is
re-delivered at its next suspension: on asyncio by ``_recancel`` one loop
iteration later, unless a cancel scope took it back meanwhile (3.11+:
``asyncio.timeout``/``wait_for``/a ``TaskGroup`` uncancelled the task; 3.10,
with no cancel count: unless the task has ended); under trio by the cancelled
scope itself, at the next checkpoint.  A blocking call whose timeout loses the
race returns the value.  Counted as ``delivered_despite_cancel``.  A result the
caller cannot take (a ``KeyboardInterrupt`` in a blocking call, a caller that
left an unresponsive owner before it settled, a cancel with no task to
re-deliver it to) is counted as ``results_dropped``.

Three kinds of callers share everything but how they wait, which is their
waker (:mod:`loopbridge._wakers`): asyncio loops (uvloop included), trio runs,
and plain threads (the blocking face).
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from ._eager import NATIVE_EAGER
from ._errors import Advice, Fix, LoopAffinityError, refuse, uses
from ._operation import Operation, Options, chain, check_block
from ._outcome import CANCELLED, ERROR, OK, PENDING, REQUESTED
from ._ownership import on_owner_thread
from ._ports import PORT_ATTR, Port, get_running_loop, running_port
from ._returns import PLAIN
from ._trio import in_trio_run, trio_port
from ._wakers import (
    UNRESPONSIVE_S,
    LoopWaker,
    ThreadWaker,
    TrioWaker,
    leave,
    new_loop_waker,
    owner_silence,
    thread_waker,
    timeout_message,
    trio_waker,
)

__all__ = [
    "Call",
    "route_call",
    "route_exit",
    "call_from_async",
    "call_from_thread",
    "cancel_message",
]

_perf = time.perf_counter
_PY311 = sys.version_info >= (3, 11)


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
        # trio, or on a plain thread): decide when it is awaited.  The coroutine
        # has the member's name, so "coroutine ... was never awaited" names it.
        coro: Any = _route_on_await(opts, fn, args, kwargs, what, finish)
        coro.__name__ = coro.__qualname__ = what.removesuffix("()")
        return coro
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
#: the caller waits for it up to ``cancel_grace`` (while the owner loop answers),
#: then gets what it returned, its cancel re-delivered (see the module).
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
    raise _no_loop(what)


def _no_loop(what: str) -> LoopAffinityError:
    """Awaiting ``what`` (``"Engine.generate()"``, or ``"awaiting a Job object"``)
    through a proxy where no loop runs: a plain thread wants the blocking face."""
    on_loop, from_thread = uses(what)
    if what.endswith("()"):
        problem = f"{what} was awaited through a proxy with no event loop running"
    else:
        problem = f"{what} through a proxy needs an event loop, and none is running here"
    return refuse(
        Advice(
            problem,
            [Fix("thread", from_thread, target="p"), Fix("loop", on_loop, target="p")],
            "p is the proxy; its blocking face waits for the result on this thread.",
        )
    )


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
        return await _caller_cancelled(call, waker, exc, finish)
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
        raise refuse(
            Advice(
                f"blocking {call.description} on the owner loop's own thread would deadlock",
                [
                    Fix(
                        "owner",
                        uses(call.description)[0],
                        target="p",
                        say="await the proxy instead:",
                    )
                ],
                "A blocking call waits for the loop this thread runs.",
            )
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
            done = waker.wait(call, timeout)
        except BaseException:  # KeyboardInterrupt, say: the caller goes
            _interrupted(call, waker)
            raise
        if done:
            return _returned(call, _perf())
        return _timed_out(call, waker, timeout)
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


async def _caller_cancelled(
    call: Call, waker: LoopWaker | TrioWaker, exc: BaseException, finish: bool
) -> Any:
    """The caller was cancelled while it waited for ``call``: take the call back or
    cancel it on the owner (``finish``: leave it running there) and wait, bounded,
    for the owner side.  Returns the value of a call that completed (the cancel is
    re-delivered: see the module), else re-raises ``exc``."""
    opts = call.opts
    # finish: it runs to completion on the owner; wait for it all the same.
    if finish or call.caller_gives_up(cancel_message(exc)):
        await waker.wait_settled(call, opts.grace)
    if call.outcome is PENDING and leave(call):  # the owner loop does not answer: go
        _note(exc, call, "goes on without the cancelled caller")
    elif call.outcome is OK:  # a result completed: it is delivered
        if _redeliver(waker, exc):
            opts.metrics.delivered_despite_cancel()
            return _returned(call, _perf())
        opts.metrics.result_dropped()
    elif not call.t_start:
        _note(exc, call, "never started, and was taken back")
    opts.metrics.returned(call, 0.0)  # admission and run, but no return: it was cancelled
    raise exc


def _redeliver(waker: LoopWaker | TrioWaker, exc: BaseException) -> bool:
    """The caller's cancel lost to a completed result: arrange for the cancel to
    reach the caller at its next suspension.  False where it cannot (no task)."""
    if type(waker) is not LoopWaker:
        return True  # trio: the cancelled scope cancels the next checkpoint again
    loop = waker.loop
    task = asyncio.current_task(loop)
    if task is None:  # a coroutine driven by hand: nothing to re-deliver to
        return False
    loop.call_soon(_recancel, task, cancel_message(exc))
    return True


def _recancel(task: asyncio.Task[Any], msg: str | None) -> None:
    """One loop iteration after a result won over the task's cancel: cancel it again
    (where it waits now), unless it ended or a cancel scope took the cancel back.

    3.11+: a scope that expired (``asyncio.timeout``, ``wait_for``) or a
    ``TaskGroup`` that exited uncancels the task on its way out, so a count of
    zero means the cancel was consumed; otherwise ``uncancel()`` first keeps the
    count what those scopes expect.  3.10 has no count: a task still running is
    cancelled again (a scope that caught the cancel, as ``async_timeout`` does,
    then sees one more).
    """
    if task.done():
        return
    if _PY311:
        if not task.cancelling():
            return
        task.uncancel()
    task.cancel(msg)


def _note(exc: BaseException, call: Call, what: str) -> None:
    """Say on a cancel why it was quick: the owner loop had not run (asyncio's
    ``TimeoutError`` carries the cancel as its cause).  Only when that loop was
    silent for ``UNRESPONSIVE_S`` or more; never on trio's exceptions."""
    owner = call.owner
    if owner is None or not isinstance(exc, asyncio.CancelledError):
        return
    silent = owner_silence(call)
    if silent < UNRESPONSIVE_S:
        return
    note = (
        f"loopbridge: {call.description} {what}: its owner loop, {owner.label}, had not run "
        f"for {silent:.2f} s (blocked or stopped)"
    )
    if _PY311:
        exc.add_note(note)
    else:  # pragma: no cover - 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined, unused-ignore]


def _timed_out(call: Call, waker: ThreadWaker, timeout: float | None) -> Any:
    """A blocking call's timeout passed: take the call back or cancel it on the owner
    (waiting for that only while the owner loop answers).  A result that won the
    race is returned; else ``TimeoutError`` saying why."""
    opts = call.opts
    assert timeout is not None
    if call.outcome is PENDING:
        if call.caller_gives_up(None):
            waker.wait_settled(call, opts.grace)
        # (Taken back mid-transfer, it is still pending: its new owner settles it.)
        if call.outcome is PENDING and leave(call):
            opts.metrics.returned(call, 0.0)
            how = "left" if call.t_start else "taken back"
            raise TimeoutError(timeout_message(call, timeout, how)) from None
    outcome = call.outcome
    if outcome is OK:  # the result won the race with the timeout
        opts.metrics.delivered_despite_cancel()
        return _returned(call, _perf())
    opts.metrics.returned(call, 0.0)
    if call.cancel is not REQUESTED:  # it failed before the timeout: that is its answer
        return call.raise_outcome()
    how = "cancelled" if call.t_start else "taken back"
    cause = call.value if outcome is ERROR else None
    raise TimeoutError(timeout_message(call, timeout, how)) from cause


def _interrupted(call: Call, waker: ThreadWaker) -> None:
    """An exception (``KeyboardInterrupt``) ended a blocking call's wait: take the
    call back or cancel it (waiting only while the owner loop answers).  A result
    that completed is dropped, and counted."""
    opts = call.opts
    if call.caller_gives_up(None):
        waker.wait_settled(call, opts.grace)
    if not (call.outcome is PENDING and leave(call)) and call.outcome is OK:
        opts.metrics.result_dropped()
    opts.metrics.returned(call, 0.0)
