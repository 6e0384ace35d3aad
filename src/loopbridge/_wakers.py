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
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ._operation import Operation
from ._outcome import PENDING
from ._ports import LIVENESS_INTERVAL, PORT_ATTR, Port, running_port

if TYPE_CHECKING:
    import trio

__all__ = [
    "LoopWaker",
    "TrioWaker",
    "ThreadWaker",
    "loop_waker",
    "trio_waker",
    "thread_waker",
]

_perf = time.perf_counter


class _PortWaker:
    """A caller on an event loop or trio run: wakes are posted to its port.

    ``wake(op)`` posts ``resolve(op)`` to the port; it is a ``partial`` rather
    than a method because it runs once per call, and the partial saves a
    Python frame there.
    """

    __slots__ = ("port", "wake")

    foreign_context = False  # see Waker.foreign_context

    def __init__(self, port: Port, resolve: Callable[[Operation], None]) -> None:
        self.port = port
        self.wake: Callable[[Operation], None] = functools.partial(port.post, resolve)

    @property
    def label(self) -> str:
        return self.port.label

    @property
    def thread_id(self) -> int | None:
        return self.port.thread_id


class LoopWaker(_PortWaker):
    """A caller on an asyncio loop: waiters are futures of that loop."""

    __slots__ = ("loop", "new_future", "join", "unpark")

    cancelled: type[BaseException] = asyncio.CancelledError

    def __init__(self, port: Port) -> None:
        super().__init__(port, _resolve_future)
        loop: asyncio.AbstractEventLoop = port.loop
        self.loop = loop
        # Joining and leaving the port's waiting set: the set's own add and
        # discard, bound once, so no Python frame per call.
        self.join: Callable[[Operation], None] = port.waiting.add
        self.unpark: Callable[[Operation], None] = port.waiting.discard
        # Stock asyncio's create_future() is a Python frame around the C
        # Future: build that directly, unless the loop makes its own futures.
        self.new_future: Callable[[], asyncio.Future[None]] = (
            functools.partial(asyncio.Future, loop=loop)
            if type(loop).create_future is asyncio.BaseEventLoop.create_future
            else loop.create_future
        )

    def arm(self, op: Operation) -> None:
        op.waiter = self.new_future()

    def park(self, op: Operation, owner: Port) -> asyncio.Future[None]:
        """What to await (the waiter itself: no coroutine frame per call)."""
        # Liveness: one shared tick on this loop checks what its callers wait on.
        self.port.park(op)
        fut: asyncio.Future[None] = op.waiter
        return fut

    def arm_and_park(self, op: Operation, owner: Port) -> asyncio.Future[None]:
        """``arm`` then ``park``, for a waiter armed after submission.

        Safe because a wake is posted to this loop and runs on this thread,
        after the caller has armed.
        """
        fut = op.waiter = self.new_future()
        # Port.park inlined, as this runs once per call: join the waiting set,
        # and start the liveness tick if none is scheduled.
        self.join(op)
        port = self.port
        if port.tick is None:
            port.start_tick()
        return fut

    async def wait_settled(self, op: Operation, owner: Port, grace: float) -> None:
        for timeout in _rounds(self, op, grace):
            timer = self.loop.call_later(timeout, _resolve, op.waiter)
            try:
                await op.waiter
            except asyncio.CancelledError:
                return  # cancelled again while waiting: stop, keep the first cancel
            finally:
                timer.cancel()
            (op.owner or owner).check_alive()  # the owner it has now (a transfer moves it)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _resolve_future(op: Operation) -> None:
    fut = op.waiter
    if fut is not None and not fut.done():
        fut.set_result(None)


class TrioWaker(_PortWaker):
    """A caller in a trio run (directly or through anyio): waiters are trio events."""

    __slots__ = ("cancelled", "_trio")

    foreign_context = True  # sniffio says "trio" in the caller's context

    def __init__(self, port: Port) -> None:
        import trio

        super().__init__(port, _set_event)
        self._trio = trio
        self.cancelled: type[BaseException] = trio.Cancelled

    def arm(self, op: Operation) -> None:
        op.waiter = self._trio.Event()

    async def arm_and_park(self, op: Operation, owner: Port) -> None:
        """``arm`` then ``park`` (a wake is posted to this run, after arming)."""
        self.arm(op)
        await self.park(op, owner)

    def unpark(self, op: Operation) -> None:
        """Nothing to forget: a trio caller checks on its own while it waits."""

    async def park(self, op: Operation, owner: Port) -> None:
        event: trio.Event = op.waiter
        move_on_after = self._trio.move_on_after
        port = self.port
        while not event.is_set():
            with move_on_after(LIVENESS_INTERVAL):
                await event.wait()
            port.drain_owed()
            (op.owner or owner).check_alive()

    async def wait_settled(self, op: Operation, owner: Port, grace: float) -> None:
        trio = self._trio
        with trio.CancelScope(shield=True):
            for timeout in _rounds(self, op, grace):
                with trio.move_on_after(timeout):
                    await op.waiter.wait()
                (op.owner or owner).check_alive()  # the owner it has now (a transfer moves it)


def _set_event(op: Operation) -> None:
    op.waiter.set()


class ThreadWaker:
    """A plain thread: waiters are locks, released by the waking side."""

    __slots__ = ("thread_id", "label")

    foreign_context = False

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

    def park(self, op: Operation, owner: Port, timeout: float | None = None) -> None:
        """Wait until woken; ``timeout``: raise ``TimeoutError`` after that many seconds."""
        lock: threading.Lock = op.waiter
        if timeout is None:
            while not lock.acquire(timeout=LIVENESS_INTERVAL):
                (op.owner or owner).check_alive()
            return
        deadline = _perf() + timeout
        while not lock.acquire(timeout=max(0.0, min(LIVENESS_INTERVAL, deadline - _perf()))):
            if _perf() >= deadline:
                raise TimeoutError(
                    f"{op.description} gave no result within {timeout} s (the blocking "
                    "face's timeout); it is cancelled on its owner loop"
                )
            (op.owner or owner).check_alive()

    def wait_settled(self, op: Operation, owner: Port, grace: float) -> None:
        for timeout in _rounds(self, op, grace):
            op.waiter.acquire(timeout=timeout)
            (op.owner or owner).check_alive()  # the owner it has now (a transfer moves it)


def _rounds(
    waker: LoopWaker | TrioWaker | ThreadWaker, op: Operation, grace: float
) -> Iterator[float]:
    """The waits of ``wait_settled``: arm, raise the flag, re-check, then yield a timeout.

    Ends when the operation is settled or ``grace`` has passed.  The timeout is
    at most the liveness interval, so each round can check the owner is alive.
    """
    deadline = _perf() + grace
    try:
        while op.outcome is PENDING:
            remaining = deadline - _perf()
            if remaining <= 0:
                return
            waker.arm(op)
            op.parked = True
            if op.outcome is not PENDING:
                return
            yield min(LIVENESS_INTERVAL, remaining)
    finally:
        op.parked = False


def loop_waker(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    """The waker of the callers on ``loop``, the running asyncio loop (one per loop).

    ``route_call`` repeats this function's common case inline (the loop's live
    port already has a waker) to save a frame per call, and calls it otherwise:
    a change to how a loop's waker is found changes both.
    """
    port: Port | None = getattr(loop, PORT_ATTR, None)
    if port is None or port.dead is not None:
        port = running_port(loop)
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
