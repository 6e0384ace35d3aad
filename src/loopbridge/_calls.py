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

Three kinds of callers share the owner side: asyncio loops (uvloop included),
trio runs, and plain threads (the blocking face).  They differ only in how the
outcome reaches them, which is what the :class:`Call` subclasses implement.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._diagnose import submission_site, tracing
from ._eager import NATIVE_EAGER, start_task, step_then_task
from ._errors import LoopAffinityError
from ._labels import thread_name as _thread_name
from ._metrics import Metrics
from ._ports import LIVENESS_INTERVAL, Port, get_running_loop, running_port

if TYPE_CHECKING:
    import trio

__all__ = ["Call", "call_from_loop", "call_from_thread", "call_from_trio", "annotate"]

_OK, _ERROR, _CANCELLED = 1, 2, 3
_PY311 = sys.version_info >= (3, 11)
_perf = time.perf_counter


def annotate(exc: BaseException, what: str, owner: Port) -> None:
    """Add a note naming the owner loop and the call (once per exception)."""
    note = f"loopbridge: raised by {what} on its owner loop ({owner.label})"
    notes = getattr(exc, "__notes__", None)
    if notes is not None and note in notes:
        return
    if _PY311:
        exc.add_note(note)
    else:  # pragma: no cover - 3.10
        exc.__notes__ = [*(notes or ()), note]  # type: ignore[attr-defined, unused-ignore]


class Call:
    """A call in flight.  The owner side is shared; delivery differs per caller."""

    __slots__ = (
        "fn",
        "args",
        "kwargs",
        "ctx",
        "what",
        "own",
        "owner",
        "task",
        "state",
        "value",
        "cancel_requested",
        "stats",
        "t_submit",
        "t_start",
        "t_end",
        "submitted_from",
        "site",
        "eager",
        "__weakref__",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        what: str,
        own: Any,
        stats: Metrics,
        eager: bool = False,
    ) -> None:
        self.eager = eager
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.ctx = contextvars.copy_context()
        self.what = what
        self.own = own
        self.owner: Port | None = None
        self.task: asyncio.Task[None] | None = None
        self.state = 0
        self.value: Any = None
        self.cancel_requested: str | bool | None = False
        self.stats = stats
        self.t_submit = _perf()
        self.t_start = 0.0
        self.t_end = 0.0
        self.submitted_from = threading.get_ident()
        self.site = submission_site() if tracing.on else None

    # -- owner side ---------------------------------------------------------
    def submit(self) -> None:
        owner = self.own._port
        if owner is None or owner.dead is not None:
            owner = self.own.port()
        self.owner = owner
        self.stats.submitted()
        try:
            owner.submit(self, _start)
        except BaseException:
            self.stats.finished(_ERROR, self)
            raise

    def settle(self, state: int, value: Any) -> None:
        """Record the outcome once and hand it to the caller (owner thread or any)."""
        if self.state:
            return
        self.state = state
        self.value = value
        self.t_end = _perf()
        owner = self.owner
        if owner is not None:
            owner.done(self)
        self.stats.finished(state, self)
        self.deliver()

    def owner_died(self, exc: BaseException) -> None:
        self.settle(_ERROR, exc)

    def describe(self) -> dict[str, Any]:
        now = _perf()
        return {
            "kind": "call",
            "what": self.what,
            "caller": self.caller_label(),
            "owner": self.owner.label if self.owner else None,
            "submitted_from_thread": _thread_name(self.submitted_from),
            "waiting_s": round(now - self.t_submit, 6),
            "running_s": round(now - self.t_start, 6) if self.t_start else None,
            "started": bool(self.t_start),
            "cancel_requested": self.cancel_requested is not False,
        }

    # -- delivery (caller side), implemented per caller kind ---------------
    def deliver(self) -> None:
        raise NotImplementedError

    def caller_label(self) -> str:
        raise NotImplementedError

    def unwrap(self) -> Any:
        """Return the result or raise the owner's exception (caller side)."""
        if self.state == _OK:
            return self.value
        exc = self.value
        if self.state == _CANCELLED:
            raise asyncio.CancelledError(*exc.args) if isinstance(exc, BaseException) else exc
        annotate(exc, self.what, self.owner)  # type: ignore[arg-type]
        raise exc


# ------------------------------------------------------------- owner side
def _start(call: Call) -> None:
    """Runs on the owner loop, from the port's drain."""
    owner = call.owner
    assert owner is not None
    if call.state:
        return
    current = call.own._port
    if current is not owner and call.own.loop is not owner.loop:
        # Ownership moved after this call was submitted: follow it.
        owner.done(call)
        try:
            call.submit()
        except BaseException as exc:
            call.settle(_ERROR, exc)
        return
    if call.cancel_requested is not False:
        call.settle(_CANCELLED, asyncio.CancelledError(call.cancel_requested))
        return
    loop = owner.loop
    call.t_start = _perf()
    coro = _run(call, loop)
    if call.eager and not NATIVE_EAGER:
        # Opt-in before 3.12: the first step runs here, without a task; only
        # a call that suspends gets one.
        call.task = step_then_task(loop, coro, call.ctx)
    else:
        call.task = start_task(loop, coro, call.ctx)


async def _run(call: Call, loop: asyncio.AbstractEventLoop) -> None:
    try:
        result = await call.fn(*call.args, **call.kwargs)
    except asyncio.CancelledError as exc:
        if call.cancel_requested is not False:
            call.settle(_CANCELLED, exc)
        else:
            # Someone on the owner side cancelled us, or the loop is shutting
            # down.  Decide one iteration later, when the port's keeper has seen
            # a shutdown sweep if there is one.
            loop.call_soon(_owner_cancelled, (call, exc))
        raise
    except BaseException as exc:
        call.settle(_ERROR, exc)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
    else:
        call.settle(_OK, result)


def _owner_cancelled(arg: tuple[Call, asyncio.CancelledError]) -> None:
    call, exc = arg
    owner = call.owner
    if owner is not None and owner.die_if_shutting_down():
        dead = owner.dead
        assert dead is not None
        call.settle(_ERROR, type(dead)(*dead.args))  # no-op: die() already failed it
        return
    call.settle(_CANCELLED, exc)


def _cancel_on_owner(arg: tuple[Call, str | None]) -> None:
    call, msg = arg
    call.cancel_requested = msg
    task = call.task
    if task is not None and not task.done():
        task.cancel(msg)
        # A task cancelled before its first step never runs _run's handlers.
        task.add_done_callback(lambda _: call.settle(_CANCELLED, asyncio.CancelledError(msg)))
    # If the task has not started yet, _start sees cancel_requested.


# ------------------------------------------------------------ asyncio caller
class LoopCall(Call):
    __slots__ = ("waiter", "caller")
    waiter: asyncio.Future[Any]
    caller: Port

    def deliver(self) -> None:
        self.caller.post(_resolve_loop_call, self)

    def caller_label(self) -> str:
        return str(self.caller.label)


def _resolve_loop_call(call: LoopCall) -> None:
    fut = call.waiter
    if fut.done():
        return
    if call.state == _CANCELLED and call.cancel_requested is False:
        fut.cancel(*call.value.args)  # owner-side cancel reaches the caller as a cancel
    else:
        fut.set_result(None)


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def call_from_loop(
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    own: Any,
    stats: Metrics,
    grace: float,
    eager: bool = False,
) -> Any:
    """Run ``fn(*args, **kwargs)`` on the owner loop; await it from ``loop``."""
    call = LoopCall(fn, args, kwargs, what, own, stats, eager)
    caller = running_port(loop)
    call.caller = caller
    fut = call.waiter = loop.create_future()
    call.submit()
    caller.watch(call.owner)  # type: ignore[arg-type]
    try:
        await fut
    except asyncio.CancelledError as exc:
        if call.state == _CANCELLED and call.cancel_requested is False:
            raise  # the owner side was cancelled: nothing to clean up
        if not call.state:
            await _cancel_and_wait(call, loop, exc.args[0] if exc.args else None, grace)
        stats.returned(call, 0.0)  # admission and run, but no return: it was cancelled
        raise
    stats.returned(call, _perf())
    return call.unwrap()


async def _cancel_and_wait(
    call: LoopCall, loop: asyncio.AbstractEventLoop, msg: str | None, grace: float
) -> None:
    """The caller was cancelled: cancel the owner task, wait boundedly for cleanup."""
    call.stats.cancelled()
    grace_fut: asyncio.Future[None] = loop.create_future()
    call.waiter = grace_fut
    call.cancel_requested = msg
    assert call.owner is not None
    try:
        call.owner.post(_cancel_on_owner, (call, msg))
    except BaseException:
        return
    timer = loop.call_later(grace, _expire, grace_fut)
    try:
        await grace_fut
    except asyncio.CancelledError:
        pass  # cancelled again while waiting: stop waiting, keep the first cancel
    finally:
        timer.cancel()


# ------------------------------------------------------------ thread caller
class ThreadCall(Call):
    __slots__ = ("lock",)
    lock: threading.Lock

    def deliver(self) -> None:
        self.lock.release()

    def caller_label(self) -> str:
        return _thread_name(self.submitted_from)


def call_from_thread(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    own: Any,
    stats: Metrics,
    grace: float,
    eager: bool = False,
) -> Any:
    """Blocking face: run on the owner loop, block this thread only."""
    loop = get_running_loop()
    if loop is not None and loop is own.loop:
        raise LoopAffinityError(
            f"blocking {what} on the owner loop's own thread would deadlock: "
            "await loopbridge.proxy(obj) instead"
        )
    call = ThreadCall(fn, args, kwargs, what, own, stats, eager)
    lock = call.lock = threading.Lock()
    lock.acquire()
    call.submit()
    owner = call.owner
    assert owner is not None
    try:
        while not lock.acquire(timeout=LIVENESS_INTERVAL):
            owner.check_alive()
    except BaseException:  # KeyboardInterrupt and friends: cancel the owner side
        if not call.state:
            call.stats.cancelled()
            call.cancel_requested = None
            try:
                owner.post(_cancel_on_owner, (call, None))
            except BaseException:
                pass
            lock.acquire(timeout=grace)
        stats.returned(call, 0.0)
        raise
    stats.returned(call, _perf())
    return call.unwrap()


# -------------------------------------------------------------- trio caller
class TrioCall(Call):
    __slots__ = ("event", "caller")
    event: trio.Event
    caller: Port

    def deliver(self) -> None:
        self.caller.post(_set_trio_event, self)

    def caller_label(self) -> str:
        return str(self.caller.label)


def _set_trio_event(call: TrioCall) -> None:
    call.event.set()


async def call_from_trio(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    own: Any,
    stats: Metrics,
    grace: float,
    eager: bool = False,
) -> Any:
    """A caller running under trio (directly or through anyio)."""
    import trio

    from ._trio import trio_port

    call = TrioCall(fn, args, kwargs, what, own, stats, eager)
    call.caller = trio_port()
    call.event = trio.Event()
    call.submit()
    owner = call.owner
    assert owner is not None
    try:
        while not call.event.is_set():
            with trio.move_on_after(LIVENESS_INTERVAL):
                await call.event.wait()
            owner.check_alive()
    except trio.Cancelled:
        if not call.state:
            call.stats.cancelled()
            call.cancel_requested = None
            owner.post(_cancel_on_owner, (call, None))
            with trio.CancelScope(shield=True):
                with trio.move_on_after(grace):
                    await call.event.wait()
        stats.returned(call, 0.0)
        raise
    if call.state == _CANCELLED:
        # Owner-side cancel: trio has no CancelledError to give, so say what happened.
        raise asyncio.CancelledError(*call.value.args)
    stats.returned(call, _perf())
    return call.unwrap()
