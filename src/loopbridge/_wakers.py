"""How a caller waits for an operation, one waker per caller kind.

Three kinds of callers wait on the owner side: asyncio loops (uvloop included),
trio runs, and plain threads (the blocking face).  A waker is what differs
between them; calls and streams use the same ones:

* ``op.waiter = waker.new_waiter()`` arms ``op`` with a fresh waiter (caller
  thread);
* ``wake(op)`` wakes that waiter (any thread; harmless when repeated);
* ``park(op)`` waits until woken, noticing a dead owner loop (the owner ``op``
  has at the time: a transfer moves it), and lets the caller's own
  cancellation through;
* ``wait_settled(op, grace)`` waits, cancel-proof and bounded, for the owner
  side to finish after a cancel request.

On an asyncio loop, ``park`` is the port's own :meth:`~loopbridge._ports.Port.park`,
``new_waiter`` the loop's future type and ``wake`` posts the port's
:func:`~loopbridge._ports.unpark_waiter`: a call arms, parks and is woken
without a Python frame of this module.

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
from ._ports import LIVENESS_INTERVAL, PORT_ATTR, Port, running_port, unpark_waiter

if TYPE_CHECKING:
    import trio

__all__ = [
    "LoopWaker",
    "TrioWaker",
    "ThreadWaker",
    "loop_waker",
    "new_loop_waker",
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

    __slots__ = ("loop", "new_waiter", "park", "unpark")

    cancelled: type[BaseException] = asyncio.CancelledError

    def __init__(self, port: Port) -> None:
        super().__init__(port, unpark_waiter)
        loop: asyncio.AbstractEventLoop = port.loop
        self.loop = loop
        # Parking is the port's (it joins the waiting set the liveness tick
        # watches) and returns the waiter itself to await; leaving is the set's
        # own discard.  Bound once: no Python frame of ours per call for either.
        self.park: Callable[[Operation], asyncio.Future[None]] = port.park
        self.unpark: Callable[[Operation], None] = port.waiting.discard
        # Stock asyncio's create_future() is a Python frame around the C
        # Future: build that directly, unless the loop makes its own futures.
        self.new_waiter: Callable[[], asyncio.Future[None]] = (
            functools.partial(asyncio.Future, loop=loop)
            if type(loop).create_future is asyncio.BaseEventLoop.create_future
            else loop.create_future
        )

    async def wait_settled(self, op: Operation, grace: float) -> None:
        for timeout in _rounds(self, op, grace):
            timer = self.loop.call_later(timeout, _resolve, op.waiter)
            try:
                await op.waiter
            except asyncio.CancelledError:
                return  # cancelled again while waiting: stop, keep the first cancel
            finally:
                timer.cancel()
            _check_owner(op)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class TrioWaker(_PortWaker):
    """A caller in a trio run (directly or through anyio): waiters are trio events."""

    __slots__ = ("cancelled", "new_waiter", "_trio")

    foreign_context = True  # sniffio says "trio" in the caller's context

    def __init__(self, port: Port) -> None:
        import trio

        super().__init__(port, _set_event)
        self._trio = trio
        self.cancelled: type[BaseException] = trio.Cancelled
        self.new_waiter: Callable[[], trio.Event] = trio.Event

    def unpark(self, op: Operation) -> None:
        """Nothing to forget: a trio caller checks on its own while it waits."""

    async def park(self, op: Operation) -> None:
        event: trio.Event = op.waiter
        move_on_after = self._trio.move_on_after
        port = self.port
        while not event.is_set():
            with move_on_after(LIVENESS_INTERVAL):
                await event.wait()
            port.drain_owed()
            _check_owner(op)

    async def wait_settled(self, op: Operation, grace: float) -> None:
        trio = self._trio
        with trio.CancelScope(shield=True):
            for timeout in _rounds(self, op, grace):
                with trio.move_on_after(timeout):
                    await op.waiter.wait()
                _check_owner(op)


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

    @staticmethod
    def new_waiter() -> threading.Lock:
        """A lock held already: the waking side releases it."""
        lock = threading.Lock()
        lock.acquire()
        return lock

    def wake(self, op: Operation) -> None:
        try:
            op.waiter.release()
        except RuntimeError:  # already released by a racing wake
            pass

    def park(self, op: Operation, timeout: float | None = None) -> None:
        """Wait until woken; ``timeout``: raise ``TimeoutError`` after that many seconds."""
        lock: threading.Lock = op.waiter
        if timeout is None:
            while not lock.acquire(timeout=LIVENESS_INTERVAL):
                _check_owner(op)
            return
        deadline = _perf() + timeout
        while not lock.acquire(timeout=max(0.0, min(LIVENESS_INTERVAL, deadline - _perf()))):
            if _perf() >= deadline:
                raise TimeoutError(
                    f"{op.description} gave no result within {timeout} s (the blocking "
                    "face's timeout); it is cancelled on its owner loop"
                )
            _check_owner(op)

    def wait_settled(self, op: Operation, grace: float) -> None:
        for timeout in _rounds(self, op, grace):
            op.waiter.acquire(timeout=timeout)
            _check_owner(op)


def _check_owner(op: Operation) -> None:
    """A waiting caller's liveness check of the owner ``op`` has now (a transfer
    moves it; every operation that is waited on was submitted, so has one)."""
    owner = op.owner
    if owner is not None:
        owner.check_alive()


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
            op.waiter = waker.new_waiter()
            op.parked = True
            if op.outcome is not PENDING:
                return
            yield min(LIVENESS_INTERVAL, remaining)
    finally:
        op.parked = False


def loop_waker(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    """The waker of the callers on ``loop``, the running asyncio loop (one per loop).

    Its common case (the loop's live port has its waker already) is also the
    first two statements of ``route_call``, which runs once per call and saves
    this frame; ``tests/core/test_one_definition.py`` fails when the two differ.
    """
    port = getattr(loop, PORT_ATTR, None)
    if port is None or port.dead is not None or (waker := port.waker) is None:
        waker = new_loop_waker(loop)
    found: LoopWaker = waker
    return found


def new_loop_waker(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    """:func:`loop_waker` past its common case: the loop's port made (or made
    anew, the old one dead) and given its waker."""
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
