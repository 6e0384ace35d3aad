"""Ports: the one thread-safe doorway into each event loop.

Every loop that loopbridge talks to (as owner or as caller) gets exactly one
:class:`Port`.  Other threads *post* work into the port's inbox; the port wakes its
loop at most once per batch, and a single drain callback on that loop runs
everything queued.  This is what turns "one cross-thread wake-up per call" into
"one wake-up per batch of calls".

Two rules keep wake-ups rare without ever losing one (both rely on the GIL making
``deque.append``/``popleft`` and attribute reads and writes atomic and ordered):

* the poster appends *before* it tests ``_wake_pending``;
* the drain clears ``_wake_pending`` *before* it pops.

So an item is either popped by a drain that is already scheduled, or its poster
sees the flag down and schedules a new one.  At worst a drain finds nothing.

When the poster is itself running inside a loop with more ready work, the wake is
deferred to the end of that loop's current iteration: on stock asyncio
``call_soon_threadsafe`` writes to a socket and gives up the GIL, so waking
immediately lets the other loop start draining a half-built batch.  The loop's
own self-pipe reader does not count as more work: it posts nothing, and
waiting for it cost a whole extra loop iteration per call at low concurrency.

A deferred wake is a *debt* of the posting loop (the debtor, ``_deferred_by``):
paid by its flush at the end of its iteration.  A loop can stop after the
iteration that deferred, and never run that flush (``loop.stop()`` then
``loop.close()``; a loop driven by ``run_until_complete`` that is not run
again).  So a debt never depends on the debtor alone:

* a port that is shutting down (dead) never defers, and pays its debts when it
  dies on its own thread;
* every liveness check of a port (:meth:`Port.check_alive`, made by whoever
  waits on it) sends the wake itself when its debtor is no longer running;
* a loop with callers parked on it ticks every ``LIVENESS_INTERVAL`` while any
  of them waits, and each tick drains that loop's own inbox and checks the
  owner each parked operation now belongs to.

Invariant: a parked caller's wait ends within two liveness intervals of its
operation being settled or its owner loop dying, whatever the order of the
settle, the death, the park and the debtor's stop.

Ports also track every call and stream in flight towards their loop, so that when
the loop stops or closes each of them can be failed with
:class:`~loopbridge.OwnerLoopClosed` instead of hanging.  Leaving a port's
in-flight set (one atomic ``dict.pop``) is an operation's settle latch: the
first writer to remove it records the outcome, and every later one does nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from . import _interleave
from ._compat import (
    callback_of,
    check_loop,
    counter_value,
    get_running_loop,
    live_thread,
    ready_queue,
    self_reader,
)
from ._errors import OwnerLoopClosed
from ._labels import loop_label as _loop_label

__all__ = [
    "Port",
    "InFlight",
    "PORT_ATTR",
    "port_for_loop",
    "running_port",
    "get_running_loop",
    "rearm",
]

#: How often waiting callers check that the owner loop is still alive (seconds).
LIVENESS_INTERVAL = 0.05


class InFlight(Protocol):
    """A call or stream registered with the port of the loop it runs on."""

    def owner_died(self, exc: BaseException) -> None:
        """Fail this operation because its owner loop is gone (any thread).

        Called only by the thread that removed it from the in-flight set.
        """

    def describe(self) -> dict[str, Any]:
        """A snapshot for hang diagnosis."""


class Port:
    """The thread-safe inbox of one event loop (asyncio, uvloop or trio)."""

    __slots__ = (
        "loop",
        "label",
        "_inbox",
        "_wake_pending",
        "_schedule_threadsafe",
        "_ready",
        "_self_reader",
        "_outgoing",
        "_flush_pending",
        "inflight",
        "dead",
        "_keeper",
        "_deferred_by",
        "waiting",
        "tick",
        "thread_id",
        "_wakes",
        "waker",
        "blocked",
        "__weakref__",
    )

    def __init__(
        self,
        loop: Any,
        schedule_threadsafe: Callable[[Callable[[], None]], Any],
        label: str,
    ) -> None:
        self.loop = loop
        self.label = label
        self._inbox: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._wake_pending = False
        self._schedule_threadsafe = schedule_threadsafe
        # Stock asyncio exposes its ready queue; its length tells whether the
        # loop has more work in this iteration (then deferring a wake pays).
        self._ready: deque[Any] | None = ready_queue(loop)
        # ... except the loop's own self-pipe reader: woken by another thread,
        # a loop runs it in the same iteration as what was posted, and it posts
        # nothing, so waiting for it would only cost a loop iteration.
        self._self_reader: Any = self_reader(loop)
        self._outgoing: list[Port] = []
        self._flush_pending = False
        self.inflight: dict[InFlight, None] = {}
        self.dead: BaseException | None = None
        self._keeper: asyncio.Task[None] | None = None
        # The loop that owes this port a deferred wake, if any.
        self._deferred_by: Port | None = None
        # Operations that callers on *this* loop are parked on; a tick is
        # scheduled exactly while it is non-empty (loop thread only).  Never
        # rebound: wakers hold its bound discard.
        self.waiting: set[Any] = set()
        # The liveness tick's timer, exactly while ``waiting`` is non-empty.
        self.tick: asyncio.TimerHandle | None = None
        # The thread last seen running this loop: for liveness (a stopped loop
        # whose thread has ended is dead) and hang dumps (uvloop has no _thread_id).
        self.thread_id: int | None = None
        self._wakes = itertools.count()  # exact from any thread
        # How callers on this loop wait (see _wakers); made on first use.
        self.waker: Any = None
        # The call (or stream) this loop's thread is blocked on in a blocking() wait, if any
        # (see _operation.check_block): None, except while a blocking call holds its thread.
        self.blocked: Any = None

    def __repr__(self) -> str:
        return f"<Port {self.label}{' dead' if self.dead else ''}>"

    # ------------------------------------------------------------------ posting
    def post(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` on this port's loop soon.  Safe from any thread."""
        self._inbox.append((fn, arg))
        if _interleave.hook is not None:
            _interleave.hook("post.appended")
        if not self._wake_pending:
            self._wake_pending = True
            self._wake()

    def _wake(self) -> None:
        here = get_running_loop()
        if here is not None and here is not self.loop:
            src: Port | None = getattr(here, _ATTR, None)
            if src is not None and src.dead is None and src.blocked is None and src._more_ready():
                # More work is ready on the posting loop: send one wake at the
                # end of its iteration, for everything posted meanwhile.
                self._deferred_by = src
                src._outgoing.append(self)
                if not src._flush_pending:
                    src._flush_pending = True
                    here.call_soon(src._flush)
                return
        self._send_wake()

    def _more_ready(self) -> bool:
        """Whether this (running, stock asyncio) loop has more ready work that
        may post: anything but its own self-pipe reader."""
        ready = self._ready
        if not ready:
            return False
        return len(ready) > 1 or callback_of(ready[0]) != self._self_reader

    def flush_deferred(self) -> None:
        """Send the wakes this loop deferred to the end of its iteration now (its own
        thread, about to block in a blocking call: the iteration will not end)."""
        if self._outgoing:
            self._flush()

    def _flush(self) -> None:
        self._flush_pending = False
        outgoing, self._outgoing = self._outgoing, []
        for port in outgoing:
            port._send_wake()

    @property
    def wakeups(self) -> int:
        """Cross-thread wake-ups sent to this loop so far."""
        return counter_value(self._wakes)

    def _send_wake(self) -> None:
        self._deferred_by = None
        next(self._wakes)
        try:
            self._schedule_threadsafe(self._drain)
        except Exception as exc:  # closed asyncio loop, finished trio run
            self.die(OwnerLoopClosed(f"{self.label} is closed ({exc})"))

    def _drain(self) -> None:
        self._wake_pending = False
        if _interleave.hook is not None:
            _interleave.hook("drain.flag_cleared")
        self.thread_id = _get_ident()
        inbox = self._inbox
        for _ in range(len(inbox)):
            fn, arg = inbox.popleft()
            try:
                fn(arg)
            except BaseException as exc:  # never lose the rest of the batch
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                self._report(exc)

    def _report(self, exc: BaseException) -> None:
        """A posted callback raised: the loop's exception handler, else the log."""
        message = "loopbridge: error in a posted callback"
        handler = getattr(self.loop, "call_exception_handler", None)
        if handler is not None:
            handler({"message": message, "exception": exc})
        else:  # a trio run: raising into trio would crash the run
            _log.error("%s on %s", message, self.label, exc_info=exc)

    # ---------------------------------------------------------------- in flight
    def submit(self, op: InFlight, start: Callable[[Any], None]) -> None:
        """Register ``op`` as in flight towards this loop and post its start."""
        if self.dead is not None:
            raise _fresh(self.dead)
        self.inflight[op] = None
        if _interleave.hook is not None:
            _interleave.hook("submit.registered")
        self.post(start, op)
        # Died while we were posting: fail here, unless die() took the
        # operation out first (then it has failed it and woken its caller).
        if self.dead is not None and self.leave(op):
            raise _fresh(self.dead)

    def leave(self, op: InFlight) -> bool:
        """Take ``op`` out of the in-flight set: the settle latch.

        True for exactly one caller per registration (``dict.pop`` is atomic);
        that caller, and only it, records the operation's outcome.
        :meth:`Operation.settle` inlines this body; keep the two in step.
        """
        if self.inflight.pop(op, _ABSENT) is _ABSENT:
            return False
        if _interleave.hook is not None:
            _interleave.hook("settle.latched")
        return True

    # ----------------------------------------------------------------- liveness
    def check_alive(self) -> bool:
        """Detect a stopped or closed loop; fail everything in flight if so.

        Also pays a wake this port is owed by a loop that stopped before its
        flush ran (any thread: everyone who waits on this port asks this).
        """
        debtor = self._deferred_by
        if debtor is not None and (debtor.dead is not None or not debtor.is_running()):
            self._send_wake()
        if self.dead is not None:
            return False
        loop = self.loop
        is_closed = getattr(loop, "is_closed", None)
        if is_closed is not None:
            if is_closed():
                self.die(OwnerLoopClosed(f"{self.label} was closed"))
                return False
            # Stopped is not dead: a stopped loop may run again (a loop driven
            # by run_until_complete is stopped between calls), and what waits
            # on it runs then.  Dead is closed, or stopped with the thread that
            # last ran it gone.
            tid = self.thread_id
            if not loop.is_running() and tid is not None and live_thread(tid) is None:
                self.die(OwnerLoopClosed(f"{self.label} stopped, and its thread has ended"))
                return False
        return True

    def die(self, exc: BaseException) -> None:
        """Mark the loop gone and fail every operation in flight towards it."""
        if self.dead is not None:
            return
        self.dead = exc
        if _interleave.hook is not None:
            _interleave.hook("die.marked")
        # The loop stays retired (new calls fail at once) until an explicit
        # transfer() to it re-arms it.
        try:
            _retired.add(self.loop)
        except TypeError:  # pragma: no cover - a loop without weak references
            pass
        with _registry_lock:
            if _ports.get(self.loop) is self:
                del _ports[self.loop]
        for op in list(self.inflight):
            if self.leave(op):
                try:
                    op.owner_died(_fresh(exc))
                except Exception:  # pragma: no cover - defensive: keep failing the rest
                    pass
        # A dead port defers no more wakes; pay those it owes now, if this is
        # its own thread (only that thread touches its outgoing list).
        if self._outgoing and self.thread_id == threading.get_ident():
            self._flush()

    def is_running(self) -> bool:
        """Whether this port's loop runs now (a trio run always does)."""
        is_running = getattr(self.loop, "is_running", None)
        return is_running is None or bool(is_running())

    # -------------------------------------------------- caller-side watchdog
    def park(self, op: Any) -> None:
        """A caller on this (asyncio) loop parks on ``op``.  Loop thread only.

        While any caller here is parked, a tick on this loop every liveness
        interval drains this loop's inbox (a wake owed by a loop that stopped
        before paying it) and checks that each parked operation's current owner
        is alive: that is how a caller notices an owner loop that was stopped
        without cancelling its tasks.
        """
        self.waiting.add(op)
        if self.tick is None:
            self.start_tick()

    def start_tick(self) -> None:
        """Schedule the liveness tick (loop thread only; none is scheduled)."""
        self.tick = self.loop.call_later(LIVENESS_INTERVAL, self._tick)

    def drain_owed(self) -> None:
        """Drain now what is queued here (this loop's own thread only).

        Normally a no-op: it matters when a wake this port is owed was deferred
        by a loop that stopped before sending it.
        """
        if self._inbox:
            self._drain()

    def _tick(self) -> None:
        self.tick = None
        self.drain_owed()
        waiting = self.waiting
        for owner in {op.owner for op in list(waiting)}:
            if owner is not None:
                owner.check_alive()
        if waiting:
            self.start_tick()

    # ------------------------------------------------------------ the keeper
    def _start_keeper(self, _: object = None) -> None:
        """A task that notices when the loop shuts down (asyncio.run, LoopThread.stop)."""
        if self._keeper is None and self.dead is None:
            self.thread_id = threading.get_ident()
            keeper = self.loop.create_task(self._keep(), name="loopbridge-keeper")
            # A done callback, not an except clause: a sweep may cancel the
            # keeper before its first step, and then no handler inside runs.
            keeper.add_done_callback(self._keeper_done)
            self._keeper = keeper

    async def _keep(self) -> None:
        await self.loop.create_future()

    def _keeper_done(self, _: object) -> None:
        self.die(OwnerLoopClosed(f"{self.label} is shutting down"))  # on this loop's thread

    def shutting_down(self) -> bool:
        """Whether a shutdown sweep (which cancels the keeper) has begun.

        Owner-side tasks cancelled in the same sweep ask this (one iteration
        later) to report OwnerLoopClosed rather than a cancel.
        """
        if self.dead is not None:
            return True
        keeper = self._keeper
        if keeper is None:
            return False
        cancelling = getattr(keeper, "cancelling", None)
        return keeper.done() or (cancelling is not None and cancelling() > 0)

    def die_if_shutting_down(self) -> bool:
        if self.shutting_down():
            self.die(OwnerLoopClosed(f"{self.label} is shutting down"))
            return True
        return False


def _fresh(exc: BaseException) -> BaseException:
    """A new instance per waiter: exceptions carry tracebacks and must not be shared."""
    return type(exc)(*exc.args)


_log = logging.getLogger("loopbridge")
_get_ident = threading.get_ident
_ABSENT = object()
_ATTR = PORT_ATTR = "_loopbridge_port"
_registry_lock = threading.Lock()
_ports: weakref.WeakKeyDictionary[Any, Port] = weakref.WeakKeyDictionary()
_retired: weakref.WeakSet[Any] = weakref.WeakSet()


def rearm(loop: asyncio.AbstractEventLoop) -> None:
    """Forget that ``loop`` was seen shutting down (an explicit transfer to it)."""
    _retired.discard(loop)


def port_for_loop(loop: asyncio.AbstractEventLoop) -> Port:
    """The port of an asyncio loop, created on first use (any thread)."""
    port = getattr(loop, _ATTR, None)
    if port is not None and port.dead is None:
        return port  # type: ignore[no-any-return]
    port = _ports.get(loop)
    if port is not None:
        return port
    if loop.is_closed():
        raise OwnerLoopClosed(f"{_loop_label(loop)} is closed")
    check_loop(loop)
    if loop in _retired:
        raise OwnerLoopClosed(f"{_loop_label(loop)} is shutting down")
    with _registry_lock:
        port = _ports.get(loop)
        if port is None:
            port = Port(loop, loop.call_soon_threadsafe, _loop_label(loop))
            _ports[loop] = port
            try:
                # The hot path reads the port from the loop itself: an attribute
                # lookup instead of a WeakKeyDictionary call.
                setattr(loop, _ATTR, port)
            except AttributeError:  # pragma: no cover - a loop without attributes
                pass
            created = True
        else:
            created = False
    if created:
        if get_running_loop() is loop:
            port._start_keeper()
        else:
            port.post(port._start_keeper, None)
    return port


def running_port(loop: asyncio.AbstractEventLoop) -> Port:
    """Fast path for the caller's own (running) loop."""
    port = getattr(loop, _ATTR, None)
    if port is not None and port.dead is None:
        return port  # type: ignore[no-any-return]
    # We are running on this loop, so it is alive whatever was concluded before
    # (its keeper may have been cancelled by a cancel-all sweep).
    _retired.discard(loop)
    return port_for_loop(loop)
