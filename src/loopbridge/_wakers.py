"""How a caller waits for an operation, one waker per caller kind.

Three kinds of callers wait on the owner side: asyncio loops (uvloop included),
trio runs, and plain threads (the blocking face).  A waker is what differs
between them; calls and streams use the same ones:

* ``op.waiter = waker.new_waiter()`` arms ``op`` with a fresh waiter (caller
  thread);
* ``wake(op)`` wakes that waiter (any thread; harmless when repeated);
* ``park(op)`` waits until woken, noticing a dead owner loop (the owner ``op``
  has at the time: a transfer moves it), and lets the caller's own
  cancellation through.  A caller loop's tick checks the owner every liveness
  interval; a plain thread blocks until woken, and the process's watchdog
  (:mod:`loopbridge._watchdog`) checks for it;
* ``wait_settled(op, grace)`` waits, cancel-proof and bounded, for the owner
  side to finish after a cancel request: at most ``grace`` seconds, and only
  while the owner loop answers.  Each round probes the owner loop (a no-op
  posted to its port); once a probe has gone unanswered for
  :data:`UNRESPONSIVE_S` the owner loop is blocked or stopped, and the caller
  stops waiting: the owner-side cancel goes on without it.  So a caller that
  gives up regains control within ``UNRESPONSIVE_S`` of giving up when its
  owner loop does not run, and a call the owner never started costs no wait at
  all (it is taken back: ``Operation.caller_gives_up``);
* :func:`leave` marks an operation its caller stopped waiting for while still
  pending: the owner side goes on, and a result it settles with afterwards is
  counted as dropped (``results_dropped`` in the metrics) instead of waking
  anyone.

On an asyncio loop, ``park`` is the port's own :meth:`~loopbridge._ports.Port.park`,
``new_waiter`` the loop's future type and ``wake`` posts the port's
:func:`~loopbridge._ports.unpark_waiter`: a call arms, parks and is woken
without a Python frame of this module.

Flag protocol (no lock of ours): the waiting side arms its waiter, raises
``op.parked``, then re-checks its condition; the settling side changes the
condition, then tests the flag.  One of the two always sees the other: with the
GIL because the steps are ordered; on a free-threaded build because the flag and
the condition (``outcome``) are attributes of one operation, each write takes
that operation's lock, and the side that takes it second sees the other's write
(a waiter written before the flag is published with it: release order).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._labels import loop_and_thread
from ._lag import overdue_s
from ._operation import Operation
from ._outcome import OK, PENDING
from ._ports import LIVENESS_INTERVAL, PORT_ATTR, Port, running_port, unpark_waiter
from ._watchdog import watched

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
    "leave",
    "owner_silence",
    "timeout_message",
    "UNRESPONSIVE_S",
]

_perf = time.perf_counter
_TIMEOUT_MAX = threading.TIMEOUT_MAX

#: A caller waiting for the owner side's cleanup stops waiting once the owner
#: loop has left a probe unanswered this long (seconds): the loop is blocked or
#: stopped.  The bound a caller's timeout or cancel adds to its own wait.
UNRESPONSIVE_S = 0.2


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
        watched().start()  # before this thread's first wait: see _watchdog (signals)

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
        if not self.wait(op, timeout):
            assert timeout is not None
            raise TimeoutError(timeout_message(op, timeout, "cancelled"))

    def wait(self, op: Operation, timeout: float | None = None) -> bool:
        """Wait until woken: True; False once ``timeout`` seconds have passed first.

        The thread blocks until then: the process's watchdog checks the owner
        while it does (a dead owner settles ``op``, which wakes it).
        """
        lock: threading.Lock = op.waiter
        if lock.acquire(blocking=False):  # settled already: nothing to watch
            return True
        watchdog = watched()
        if watchdog.thread is None and not watchdog.start():  # interpreter shutdown
            return _poll(op, timeout)
        try:
            watchdog.add(op)
            if timeout is None:
                return lock.acquire()
            deadline = _perf() + timeout
            # A lock waits at most TIMEOUT_MAX at a time (more raises OverflowError).
            while not lock.acquire(timeout=min(max(0.0, deadline - _perf()), _TIMEOUT_MAX)):
                if _perf() >= deadline:
                    return False
            return True
        finally:
            watchdog.discard(op)

    def wait_settled(self, op: Operation, grace: float) -> None:
        for timeout in _rounds(self, op, grace):
            op.waiter.acquire(timeout=timeout)
            _check_owner(op)


def _poll(op: Operation, timeout: float | None) -> bool:
    """``ThreadWaker.wait`` with no watchdog to check the owner (no thread can start:
    interpreter shutdown): wake every liveness interval to check it here."""
    lock: threading.Lock = op.waiter
    deadline = None if timeout is None else _perf() + timeout
    while True:
        left = LIVENESS_INTERVAL if deadline is None else min(LIVENESS_INTERVAL, deadline - _perf())
        if lock.acquire(timeout=max(0.0, left)):
            return True
        if deadline is not None and _perf() >= deadline:
            return False
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

    Ends when the operation is settled, ``grace`` has passed, or the owner loop
    has left a probe unanswered for ``UNRESPONSIVE_S``.  The timeout is at most
    the liveness interval, so each round can check the owner is alive; a probe
    is posted whenever the last one was answered.
    """
    now = _perf()
    deadline = now + grace
    op.answered = 0.0
    _probe(op, now)
    try:
        while op.outcome is PENDING:
            now = _perf()
            remaining = deadline - now
            if remaining <= 0:
                return
            if op.answered >= op.probed:  # the owner loop runs: ask again
                _probe(op, now)
            elif now - op.probed >= UNRESPONSIVE_S:
                return  # the owner loop does not run: its cancel goes on without us
            op.waiter = waker.new_waiter()
            op.parked = True  # under op's lock (free-threaded), as settle's outcome write
            if op.outcome is not PENDING:
                return
            yield min(LIVENESS_INTERVAL, remaining, op.probed + UNRESPONSIVE_S - now)
    finally:
        op.parked = False


def _probe(op: Operation, now: float) -> None:
    """Ask the owner loop of ``op`` to answer (a waiting caller; the cancel path only)."""
    op.probed = now
    owner = op.owner
    if owner is not None:
        try:
            owner.post(_answer, op)
        except BaseException:  # the owner is gone: die() settles op
            pass


def _answer(op: Operation) -> None:
    """A probe, run by the owner loop: it runs."""
    op.answered = _perf()


class _Left:
    """The waker of an operation its caller stopped waiting for while it was still
    pending (see :func:`leave`): a result it settles with is counted, not delivered."""

    __slots__ = ("claim", "label", "thread_id", "foreign_context")

    def __init__(self, waker: Any) -> None:
        # One item: the first of the caller and the settling side to pop it
        # owns the outcome (list.pop is atomic: under the list's own lock on a
        # free-threaded build); the other finds it empty.
        self.claim = [True]
        self.label = f"{waker.label} (gone)"
        self.thread_id = waker.thread_id
        self.foreign_context: bool = getattr(waker, "foreign_context", False)

    def wake(self, op: Operation) -> None:
        try:
            self.claim.pop()
        except IndexError:  # the caller saw the outcome first and took it
            return
        if op.outcome is OK:
            op.opts.metrics.result_dropped()


def leave(op: Operation) -> bool:
    """The caller stops waiting for ``op`` (caller thread).  True: it left, and
    what ``op`` settles with later is counted, not delivered.  False: ``op``
    settled meanwhile, and the caller takes its outcome.

    The caller writes ``op.waker`` then reads the outcome; a settle writes the
    outcome then reads ``op.waker``.  One sees the other: with the GIL, by order;
    on a free-threaded build, both are writes to the operation, each under its
    lock.  When both see the other, the claim decides.
    """
    left = _Left(op.waker)
    op.waker = left
    if op.outcome is PENDING:
        return True
    try:
        left.claim.pop()
    except IndexError:  # the settling side saw the new waker and counted it
        return True
    return False


def owner_silence(op: Operation) -> float:
    """Seconds for which the owner loop of ``op`` has certainly not run (0.0:
    it answered lately), after its caller gave up on it (caller thread).

    A start still queued says its port was not drained since the submission;
    an unanswered probe, since that probe; an overdue lag monitor timer
    (:func:`loopbridge.metrics.monitor_lag`), since it was due.
    """
    now = _perf()
    owner = op.owner
    since = now
    if not op.t_start:
        since = op.t_submit
    else:
        probed = getattr(op, "probed", now)
        if getattr(op, "answered", 0.0) < probed:
            since = probed
    overdue = overdue_s(owner.loop) if owner is not None else 0.0
    return max(now - since, overdue)


def timeout_message(op: Operation, timeout: float, how: str) -> str:
    """Why a blocking call gave up after ``timeout`` seconds.

    ``how``: ``"taken back"`` (the owner never started it), ``"left"`` (the
    owner loop did not answer, so the caller did not wait for its cancel) or
    ``"cancelled"`` (cancelled on the owner, which answered).
    """
    owner = op.owner
    where = "its owner loop"
    running = True
    if owner is not None:
        where = f"its owner loop, {loop_and_thread(owner.loop, owner.thread_id)},"
        running = owner.is_running()
    head = f"{op.description} gave no result within {timeout} s (the blocking face's timeout)"
    if how == "cancelled":
        return (
            f"{head} and was cancelled on {where.rstrip(',')}: give it a larger timeout "
            "(blocking(p, timeout=...)) if it needs longer."
        )
    silent = owner_silence(op)
    if running:
        state = f"has not run for {silent:.2f} s"
        fix = (
            "unblock that loop (move blocking or CPU-bound work off it, with "
            "asyncio.to_thread or loop.run_in_executor) or give the call a larger timeout"
        )
    else:
        state = f"is stopped and has not run for {silent:.2f} s"
        fix = "run that loop (calls wait until it runs again) or give the call a larger timeout"
    if how == "taken back":
        return (
            f"{head}: {where} {state}, so the call never started, and was taken back "
            f"(it will not run there); {fix}."
        )
    return (
        f"{head}: {where} {state}; {fix}. The call is cancelled there, and goes on "
        "without this caller until that loop runs again."
    )


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


def _forget_thread_waker() -> None:
    """In a forked child: the surviving thread makes a new waker on its next wait,
    which starts the child's watchdog before that wait (see _watchdog: signals)."""
    _threads.__dict__.pop("waker", None)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_thread_waker)


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
