"""How a caller waits for an operation, one waker per caller kind.

Three kinds of callers wait on the owner side: asyncio loops (uvloop included),
trio runs, and plain threads (the blocking face).  A waker is what differs
between them; calls and streams use the same ones:

* ``arm(op)`` gives ``op`` a fresh waiter (caller thread);
* ``wake(op)`` wakes that waiter (any thread; harmless when repeated);
* ``park(op, owner)`` waits until woken, noticing a dead owner loop, and lets
  the caller's own cancellation through;
* ``wait_settled(op, owner, grace)`` waits, cancel-proof and bounded, for the
  owner side to finish after a cancel request.

Flag protocol (GIL-ordered, no lock): the waiting side arms its waiter, raises
``op.parked``, then re-checks its condition; the settling side changes the
condition, then tests the flag.  One of the two always sees the other.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

from ._operation import PENDING, Operation
from ._ports import LIVENESS_INTERVAL, Port

if TYPE_CHECKING:
    import trio

__all__ = [
    "Waker",
    "LoopWaker",
    "TrioWaker",
    "ThreadWaker",
    "NOT_WAITING",
    "loop_waker",
    "trio_waker",
    "thread_waker",
]

_perf = time.perf_counter


class LoopWaker:
    """A caller on an asyncio loop: waiters are futures of that loop."""

    __slots__ = ("port", "loop")

    cancelled: type[BaseException] = asyncio.CancelledError

    def __init__(self, port: Port) -> None:
        self.port = port
        self.loop: asyncio.AbstractEventLoop = port.loop

    @property
    def label(self) -> str:
        return self.port.label

    @property
    def thread_id(self) -> int | None:
        return self.port.thread_id

    def arm(self, op: Operation) -> None:
        op.waiter = self.loop.create_future()

    def wake(self, op: Operation) -> None:
        self.port.post(_resolve_future, op)

    async def park(self, op: Operation, owner: Port) -> None:
        # Liveness: one shared timer on this loop checks the owners its callers wait on.
        self.port.watch(owner)
        await op.waiter

    async def wait_settled(self, op: Operation, owner: Port, grace: float) -> None:
        deadline = _perf() + grace
        loop = self.loop
        try:
            while op.outcome is PENDING:
                remaining = deadline - _perf()
                if remaining <= 0:
                    return
                fut = op.waiter = loop.create_future()
                op.parked = True
                if op.outcome is not PENDING:
                    return
                timer = loop.call_later(min(LIVENESS_INTERVAL, remaining), _resolve, fut)
                try:
                    await fut
                except asyncio.CancelledError:
                    return  # cancelled again while waiting: stop, keep the first cancel
                finally:
                    timer.cancel()
                owner.check_alive()
        finally:
            op.parked = False


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _resolve_future(op: Operation) -> None:
    fut = op.waiter
    if fut is not None and not fut.done():
        fut.set_result(None)


class TrioWaker:
    """A caller in a trio run (directly or through anyio): waiters are trio events."""

    __slots__ = ("port", "cancelled", "_trio")

    def __init__(self, port: Port) -> None:
        import trio

        self.port = port
        self._trio = trio
        self.cancelled: type[BaseException] = trio.Cancelled

    @property
    def label(self) -> str:
        return self.port.label

    @property
    def thread_id(self) -> int | None:
        return self.port.thread_id

    def arm(self, op: Operation) -> None:
        op.waiter = self._trio.Event()

    def wake(self, op: Operation) -> None:
        self.port.post(_set_event, op)

    async def park(self, op: Operation, owner: Port) -> None:
        event: trio.Event = op.waiter
        move_on_after = self._trio.move_on_after
        while not event.is_set():
            with move_on_after(LIVENESS_INTERVAL):
                await event.wait()
            owner.check_alive()

    async def wait_settled(self, op: Operation, owner: Port, grace: float) -> None:
        trio = self._trio
        deadline = _perf() + grace
        try:
            with trio.CancelScope(shield=True):
                while op.outcome is PENDING:
                    remaining = deadline - _perf()
                    if remaining <= 0:
                        return
                    event = op.waiter = trio.Event()
                    op.parked = True
                    if op.outcome is not PENDING:
                        return
                    with trio.move_on_after(min(LIVENESS_INTERVAL, remaining)):
                        await event.wait()
                    owner.check_alive()
        finally:
            op.parked = False


def _set_event(op: Operation) -> None:
    op.waiter.set()


class ThreadWaker:
    """A plain thread: waiters are locks, released by the waking side."""

    __slots__ = ("thread_id", "label")

    # KeyboardInterrupt and friends interrupt a blocked thread.
    cancelled: type[BaseException] = BaseException

    def __init__(self) -> None:
        self.thread_id: int | None = threading.get_ident()
        self.label = threading.current_thread().name

    def arm(self, op: Operation) -> None:
        lock = threading.Lock()
        lock.acquire()
        op.waiter = lock

    def wake(self, op: Operation) -> None:
        try:
            op.waiter.release()
        except RuntimeError:  # already released by a racing wake
            pass

    def park(self, op: Operation, owner: Port) -> None:
        lock: threading.Lock = op.waiter
        while not lock.acquire(timeout=LIVENESS_INTERVAL):
            owner.check_alive()

    def wait_settled(self, op: Operation, owner: Port, grace: float) -> None:
        deadline = _perf() + grace
        try:
            while op.outcome is PENDING:
                remaining = deadline - _perf()
                if remaining <= 0:
                    return
                self.arm(op)
                op.parked = True
                if op.outcome is not PENDING:
                    return
                op.waiter.acquire(timeout=min(LIVENESS_INTERVAL, remaining))
                owner.check_alive()
        finally:
            op.parked = False


class NotWaiting:
    """A stream nobody iterates yet: there is no caller to wake."""

    __slots__ = ()

    label = "nobody yet"
    thread_id = None

    def wake(self, op: Operation) -> None:
        pass


NOT_WAITING = NotWaiting()

Waker = LoopWaker | TrioWaker | ThreadWaker | NotWaiting


def loop_waker(port: Port) -> LoopWaker:
    """The waker of the callers on ``port``'s asyncio loop (one per loop)."""
    waker: LoopWaker | None = port.waker
    if waker is None:
        waker = port.waker = LoopWaker(port)
    return waker


_threads = threading.local()


def thread_waker() -> ThreadWaker:
    """The waker of this plain thread (one per thread)."""
    waker: ThreadWaker | None = getattr(_threads, "waker", None)
    if waker is None:
        waker = _threads.waker = ThreadWaker()
    return waker


def trio_waker(port: Port) -> TrioWaker:
    waker: TrioWaker | None = port.waker
    if waker is None:
        waker = port.waker = TrioWaker(port)
    return waker
