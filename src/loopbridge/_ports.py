"""Ports: the one thread-safe doorway into each event loop.

Every loop that loopbridge talks to (as owner or as caller) gets exactly one
:class:`Port`.  Other threads *post* work into the port's inbox; the port wakes its
loop at most once per batch, and a single drain callback on that loop runs
everything queued.  This is what turns "one cross-thread wake-up per call" into
"one wake-up per batch of calls".

A port's wake protocol has three states, :class:`Wake`, in ``Port.wake_state``:

=============  ===========================================================
``IDLE``       no wake pending: the next post wakes the loop (or defers it)
``SCHEDULED``  a drain is scheduled on the loop (or is being, by the post
               that claimed it): a post only appends
``OWED``       the wake was deferred: the posting loop (the *debtor*,
               ``Port.debtor``) owes it, and a post only appends
=============  ===========================================================

Each transition has one function:

* :meth:`Port.post`: ``IDLE`` to ``SCHEDULED`` (it claims the wake, then sends
  it), or on to ``OWED`` (:meth:`Port._owe`, while the posting loop has more
  ready work);
* :meth:`Port._send_wake`: ``OWED`` to ``SCHEDULED`` (paying a debt), or the
  wake of a claim (a late payment, whose debt a liveness tick drained first,
  leaves ``IDLE`` as it is);
* :meth:`Port._drain`: ``SCHEDULED`` to ``IDLE``, when the drain begins.

Three rules keep wake-ups rare without ever losing one (with the GIL, because
``deque.append``/``popleft`` and attribute reads and writes are atomic and ordered;
on a free-threaded build, because each append, pop and attribute write takes its
object's own lock, so of two threads the one that takes a shared object's lock
second sees what the other wrote before taking it; each line says which):

* the poster appends *before* it tests ``wake_state``;
* the drain sets ``IDLE`` *before* it pops;
* a wake is ``OWED`` only while a debtor holds it: set with ``Port.debtor``,
  left only by :meth:`Port._send_wake`.

So an item is either popped by a drain that is already scheduled or owed, or its
poster sees ``IDLE`` and wakes the loop itself.  At worst a drain finds nothing.

A wake is deferred (``OWED``) when the poster is itself running inside a loop
with more ready work: on stock asyncio ``call_soon_threadsafe`` writes to a
socket and gives up the GIL, so waking immediately lets the other loop start
draining a half-built batch.  The loop's own self-pipe reader does not count as
more work: it posts nothing, and waiting for it cost a whole extra loop
iteration per call at low concurrency.

A debt is paid by the debtor's flush at the end of its iteration (the debtor's
``_outgoing`` list holds the ports it owes; a flush is scheduled exactly when
that list stops being empty).  A loop can stop after the iteration that
deferred, and never run that flush (``loop.stop()`` then ``loop.close()``; a
loop driven by ``run_until_complete`` that is not run again).  So a debt never
depends on the debtor alone:

* a port that is dead, or whose loop's thread is blocked in a blocking call,
  never becomes a debtor, and a dying port pays its debts when it dies on its
  own thread;
* every liveness check of an ``OWED`` port (:meth:`Port.check_alive`, made by
  whoever waits on it) sends the wake itself when its debtor is no longer
  running;
* a loop with callers parked on it ticks every ``LIVENESS_INTERVAL`` while any
  of them waits, and each tick drains that loop's own inbox and checks the
  owner each parked operation now belongs to; for callers blocked in plain
  threads, the process's watchdog (:mod:`loopbridge._watchdog`) makes the same
  checks.

Invariant: a parked caller's wait ends within two liveness intervals of its
operation being settled or its owner loop dying, whatever the order of the
settle, the death, the park and the debtor's stop.

A port's life is separate from its wake state, because :meth:`Port.die` runs
on any thread while posters and the drain write ``wake_state``: ``dead`` is
``None`` while the loop lives and the error that ended it afterwards (set once,
never cleared; a dead port still delivers what is posted to it while its loop
runs, as a loop that is shutting down still runs callbacks).  ``_keeper`` is the
task whose end tells that the loop is shutting down.

A port is found from its loop (an attribute of the loop), and the registry of
live ports holds it weakly: a loop and its port hold each other, and the
collector frees both once nothing else holds the loop, including a loop closed
without ``asyncio.run``'s cancel-all sweep, whose keeper never ended and whose
port never died.  The keeper is loopbridge's, not the user's: asyncio is told
not to report it destroyed while pending.

Ports also track every call and stream in flight towards their loop, so that when
the loop stops or closes each of them can be failed with
:class:`~loopbridge.OwnerLoopClosed` instead of hanging.  Leaving a port's
in-flight set (one atomic ``dict.pop``) is an operation's settle latch: the
first writer to remove it records the outcome, and every later one does nothing.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
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
    thread_id_of,
)
from ._errors import OwnerLoopClosed, fork_advice, owner_closed
from ._labels import loop_label as _loop_label

__all__ = [
    "ABSENT",
    "Port",
    "Wake",
    "InFlight",
    "PORT_ATTR",
    "port_for_loop",
    "running_port",
    "get_running_loop",
    "live_ports",
    "rearm",
    "unpark_waiter",
]

#: How often waiting callers check that the owner loop is still alive (seconds).
LIVENESS_INTERVAL = 0.05


class Wake(enum.Enum):
    """Where a port's wake stands (``Port.wake_state``); see the module's table."""

    IDLE = "idle"  # no wake pending: the next post wakes the loop
    SCHEDULED = "scheduled"  # a drain is scheduled (or being, by the post that claimed it)
    OWED = "owed"  # deferred: Port.debtor's flush sends it


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
        "wake_state",
        "_schedule_threadsafe",
        "_ready",
        "_self_reader",
        "_outgoing",
        "inflight",
        "dead",
        "_keeper",
        "debtor",
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
        self.wake_state = IDLE  # see Wake; one of its functions changes it
        self._schedule_threadsafe = schedule_threadsafe
        # Stock asyncio exposes its ready queue; its length tells whether the
        # loop has more work in this iteration (then deferring a wake pays).
        self._ready: deque[Any] | None = ready_queue(loop)
        # ... except the loop's own self-pipe reader: woken by another thread,
        # a loop runs it in the same iteration as what was posted, and it posts
        # nothing, so waiting for it would only cost a loop iteration.
        self._self_reader: Any = self_reader(loop)
        # The ports this loop owes a deferred wake (its own thread only); a
        # flush is scheduled exactly when the list stops being empty.
        self._outgoing: list[Port] = []
        self.inflight: dict[InFlight, None] = {}
        self.dead: BaseException | None = None
        self._keeper: asyncio.Task[None] | None = None
        # The port whose loop owes this one its wake, while OWED.
        self.debtor: Port | None = None
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
        """Run ``fn(arg)`` on this port's loop soon.  Safe from any thread.

        The ``IDLE`` transitions: to ``SCHEDULED`` (the wake is sent now), or to
        ``OWED`` when the posting loop has more ready work (see the module).
        """
        # One deque.append (under the inbox's lock on a free-threaded build), then
        # wake_state read: a drain whose locked pop came first wrote IDLE before it.
        self._inbox.append((fn, arg))
        if _interleave.hook is not None:
            _interleave.hook("post.appended")
        if self.wake_state is not IDLE:
            return  # a drain is scheduled or owed: it takes this item too
        self.wake_state = SCHEDULED  # claimed: later posts only append
        here = get_running_loop()
        if here is not None and here is not self.loop:
            src: Port | None = getattr(here, _ATTR, None)
            if src is not None and src.dead is None and src.blocked is None:
                # More ready work on the posting loop that may post: anything
                # but its own self-pipe reader.  Then send one wake at the end
                # of its iteration, for everything posted meanwhile.
                ready = src._ready
                if ready and (len(ready) > 1 or callback_of(ready[0]) != src._self_reader):
                    self._owe(src, here)
                    return
        self._send_wake()

    def _owe(self, debtor: Port, here: Any) -> None:
        """``SCHEDULED`` (just claimed by a post) to ``OWED``: ``debtor``'s loop,
        running ``here`` on this thread, sends the wake from its flush."""
        # The debtor, then OWED: each store takes the port's lock and publishes with
        # release order on a free-threaded build, so a reader that sees OWED sees it.
        self.debtor = debtor
        self.wake_state = OWED
        outgoing = debtor._outgoing
        if not outgoing:
            here.call_soon(debtor._flush)
        outgoing.append(self)

    def flush_deferred(self) -> None:
        """Send the wakes this loop deferred to the end of its iteration now (its own
        thread, about to block in a blocking call: the iteration will not end)."""
        if self._outgoing:
            self._flush()

    def _flush(self) -> None:
        """Pay this loop's debts: send the wakes it deferred (its own thread)."""
        outgoing, self._outgoing = self._outgoing, []
        for port in outgoing:
            port._send_wake()

    @property
    def wakeups(self) -> int:
        """Cross-thread wake-ups sent to this loop so far."""
        return counter_value(self._wakes)

    def _send_wake(self) -> None:
        """Schedule a drain on the loop (any thread): ``OWED`` to ``SCHEDULED``
        (a debt paid), or the wake a post claimed.

        A payment that finds ``IDLE`` leaves it so: a liveness tick drained what
        was owed first, and the next post still wakes the loop itself (a drain
        that finds nothing costs less than a post left to a drain already run).
        """
        if self.wake_state is OWED:
            self.wake_state = SCHEDULED
        self.debtor = None
        next(self._wakes)
        try:
            self._schedule_threadsafe(self._drain)
        except Exception as exc:  # closed asyncio loop, finished trio run
            self.die(OwnerLoopClosed(f"{self.label} is closed ({exc})"))

    def _drain(self) -> None:
        """``SCHEDULED`` to ``IDLE``, then run what was posted (the loop's thread)."""
        self.wake_state = IDLE
        if _interleave.hook is not None:
            _interleave.hook("drain.flag_cleared")
        self.thread_id = _get_ident()
        inbox = self._inbox
        # The batch is counted after a pop, not before: popleft takes the inbox's
        # lock on a free-threaded build (len() reads without it), so every append
        # that took that lock before is counted, and a later one's poster reads
        # wake_state after IDLE was written (free-threaded build: docs/concepts.md).
        try:
            fn, arg = inbox.popleft()
        except IndexError:
            return  # a drain that finds nothing
        left = len(inbox)
        while True:
            try:
                fn(arg)
            except BaseException as exc:  # never lose the rest of the batch
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                self._report(exc)
            if not left:
                return
            left -= 1
            fn, arg = inbox.popleft()

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
        # A dict setitem, then ``dead`` read; die() writes ``dead``, then copies the
        # dict. Both dict operations take its lock (free-threaded build): whichever
        # is second sees the other's write (the copy sees op, or this read sees dead).
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
        ``Operation.settle`` repeats these statements to save a frame per
        operation; tests/core/test_one_definition.py compares the two.
        """
        # One dict.pop: atomic under the GIL, and under the dict's own lock on a
        # free-threaded build; either way exactly one caller gets op back.
        if self.inflight.pop(op, ABSENT) is ABSENT:
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
        if self.wake_state is OWED:
            debtor = self.debtor  # read after OWED: written before it (see _owe)
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
            ref = _ports.get(id(self))
            if ref is not None and ref() is self:
                del _ports[id(self)]
            if _unattributed.get(self.loop) is self:
                del _unattributed[self.loop]
        for op in list(self.inflight):  # copied under the dict's lock: see submit()
            if self.leave(op):
                try:
                    op.owner_died(_for_operation(op, exc))
                except Exception:  # pragma: no cover - defensive: keep failing the rest
                    pass
        # A dead port defers no more wakes; pay those it owes now, if this is
        # its own thread (only that thread touches its outgoing list).
        if self._outgoing and self.thread_id == threading.get_ident():
            self._flush()

    def survives_fork(self, survivor: int) -> bool:
        """In a forked child: whether this loop can still run there.

        Only the thread that called ``fork()`` (``survivor``) exists in the child.
        A loop lives on when that thread ran it last (it may be running it now:
        a fork from inside a coroutine), or when it is stopped and never ran.
        A loop the copied state says is running on any other thread never runs
        again, though its ``is_running()`` still says True.
        """
        tid = thread_id_of(self.loop) or self.thread_id
        return tid == survivor or (tid is None and not self.is_running())

    def is_running(self) -> bool:
        """Whether this port's loop runs now (a trio run always does)."""
        is_running = getattr(self.loop, "is_running", None)
        return is_running is None or bool(is_running())

    # -------------------------------------------------- caller-side watchdog
    def park(self, op: Any) -> Any:
        """A caller on this (asyncio) loop parks on ``op``; returns its waiter, to
        await.  Loop thread only (a loop waker's ``park``: see _wakers).

        While any caller here is parked, a tick on this loop every liveness
        interval drains this loop's inbox (a wake owed by a loop that stopped
        before paying it) and checks that each parked operation's current owner
        is alive: that is how a caller notices an owner loop that was stopped
        without cancelling its tasks.
        """
        self.waiting.add(op)
        if self.tick is None:
            self.start_tick()
        return op.waiter

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
            # Pending for the loop's whole life by design: a loop closed without
            # cancelling its tasks drops it, and that is no lost work of the user's
            # (asyncio's own run_until_complete says the same of its future).
            keeper._log_destroy_pending = False
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


def unpark_waiter(op: Any) -> None:
    """Resolve the future a caller parked on with :meth:`Port.park` (posted to
    the caller's port by whoever settles ``op``; harmless when repeated)."""
    fut = op.waiter
    if fut is not None and not fut.done():
        fut.set_result(None)


def _for_operation(op: Any, exc: BaseException) -> BaseException:
    """The error of ``op`` when its owner loop died of ``exc``: it names ``op``."""
    if type(exc) is OwnerLoopClosed and isinstance(getattr(op, "description", None), str):
        return owner_closed(op.description, exc)
    return _fresh(exc)


def _fresh(exc: BaseException) -> BaseException:
    """A new instance per waiter: exceptions carry tracebacks and must not be shared."""
    return type(exc)(*exc.args)


_log = logging.getLogger("loopbridge")
IDLE, SCHEDULED, OWED = Wake.IDLE, Wake.SCHEDULED, Wake.OWED  # one load each
_get_ident = threading.get_ident
ABSENT = object()  # what dict.pop returns for an operation not (or no longer) in flight
_ATTR = PORT_ATTR = "_loopbridge_port"
# Registries: written under _registry_lock; read without it by single dict and set
# operations, each atomic (under the container's own lock on a free-threaded build).
# A loop's port is its _ATTR attribute, so a loop its user let go is freed with its
# port.  _ports (by id) holds a weak reference to each port that has not died, for
# a fork and for dump_in_flight: a plain dict written under the lock only, with no
# callback, because the collector frees a port on whatever thread allocates, maybe
# one inside this lock; the next port made drops the references that went dead.
_registry_lock = threading.Lock()
_ports: dict[int, weakref.ReferenceType[Port]] = {}
# The port of a loop that takes no attributes (none known): held until it dies.
_unattributed: weakref.WeakKeyDictionary[Any, Port] = weakref.WeakKeyDictionary()
_retired: weakref.WeakSet[Any] = weakref.WeakSet()


def _no_wake(_: Callable[[], None]) -> None:
    """The wake of a port whose loop did not survive a fork: nothing to wake (the
    loop's self-pipe is shared with the parent, whose loop would be woken)."""


def fork_message(label: str, thread: str | None) -> str:
    """The error of every call to a loop whose thread did not survive a fork."""
    return fork_advice(label, thread).render()


#: The names of the ports' threads as the parent saw them at a fork (child only).
_thread_names: dict[int, str] = {}


def _before_fork() -> None:
    """Name each port's thread while it still exists (the forking thread, in the parent)."""
    _thread_names.clear()
    for port in live_ports():
        tid = port.thread_id
        if tid is not None and (thread := live_thread(tid)) is not None:
            _thread_names[tid] = thread.name


def _after_fork_in_child() -> None:
    """``os.register_at_fork(after_in_child=...)``: in a forked child, fail at once
    every operation in flight towards a loop whose thread did not survive, and
    every later call to it, instead of waiting on a loop that will never run.

    The registry's lock is made anew: another thread may have held it at the fork.
    """
    global _registry_lock
    _registry_lock = threading.Lock()
    survivor = _get_ident()
    gone = [p for p in live_ports() if not p.survives_fork(survivor)]
    for port in gone:
        port._schedule_threadsafe = _no_wake  # before any dies: their callers' wakes
    for port in gone:
        name = _thread_names.get(port.thread_id) if port.thread_id is not None else None
        port.die(OwnerLoopClosed(fork_message(port.label, name)))
    _thread_names.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_thread_names.clear,
        after_in_child=_after_fork_in_child,
    )


def live_ports() -> list[Port]:
    """Every port that has not died and is not freed (any thread)."""
    with _registry_lock:
        refs = list(_ports.values())
    return [port for ref in refs if (port := ref()) is not None]


def rearm(loop: asyncio.AbstractEventLoop) -> None:
    """Forget that ``loop`` was seen shutting down (an explicit transfer to it)."""
    _retired.discard(loop)


def port_for_loop(loop: asyncio.AbstractEventLoop) -> Port:
    """The port of an asyncio loop, created on first use (any thread)."""
    port = getattr(loop, _ATTR, None)
    if port is not None and port.dead is None:
        return port  # type: ignore[no-any-return]
    port = _unattributed.get(loop)
    if port is not None:
        return port
    if loop.is_closed():
        raise OwnerLoopClosed(f"{_loop_label(loop)} is closed")
    check_loop(loop)
    if loop in _retired:
        gone: Port | None = getattr(loop, _ATTR, None)
        if gone is not None and gone.dead is not None:
            raise _fresh(gone.dead)  # why it died (a fork, a shutdown)
        raise OwnerLoopClosed(f"{_loop_label(loop)} is shutting down")
    with _registry_lock:
        port = getattr(loop, _ATTR, None)
        if port is not None and port.dead is not None:
            port = None  # a port that died; the loop was re-armed since
        if port is None:
            port = _unattributed.get(loop)
        if port is None:
            port = Port(loop, loop.call_soon_threadsafe, _loop_label(loop))
            for key, ref in list(_ports.items()):
                if ref() is None:
                    del _ports[key]
            _ports[id(port)] = weakref.ref(port)
            try:
                # The hot path reads the port from the loop itself: an attribute
                # lookup instead of a WeakKeyDictionary call.
                setattr(loop, _ATTR, port)
            except AttributeError:  # pragma: no cover - a loop without attributes
                _unattributed[loop] = port
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
