"""The liveness watchdog of callers blocked in plain threads: one thread per process.

A caller on an event loop notices a dead owner loop through its own loop's
liveness tick (:meth:`~loopbridge._ports.Port.park`).  A caller in a plain
thread (the blocking face) has no loop to tick: it blocks in
``lock.acquire()``.  It used to wake every liveness interval to check its owner
itself, and from 16 threads those timed waits were 320 wake-ups a second, each
a context switch and a GIL hand-off taken from the owner loop, whether or not
anything had happened.  Now such a caller blocks until it is woken, and this
watchdog checks for all of them: every :data:`~loopbridge._ports.LIVENESS_INTERVAL`
while any thread caller waits, it asks each waited-on owner
:meth:`~loopbridge._ports.Port.check_alive`.  A loop found closed, or stopped
with its thread gone, dies there, and dying settles every operation in flight
towards it, which wakes its caller; a wake owed by a loop that stopped before
paying it is paid.

Invariants:

* the watchdog thread sleeps on its bell (a lock) while no thread caller
  waits (``idle``), and costs nothing then; a caller that parks while it sleeps
  rings it, once;
* an operation that a thread caller parks on is checked within two liveness
  intervals, and again every interval while it waits, on the owner the
  operation has at the time (a transfer moves it).  So a blocked thread caller
  notices its owner's death within the same bound as a caller on a loop
  (the :mod:`~loopbridge._ports` invariant).

Locking: ``parked`` and ``idle`` are read and written under ``lock`` only, so
the same holds with the GIL and on a free-threaded build.  A caller takes that
lock twice per wait (it adds, then discards, its operation), uncontended but for
the watchdog's copy of the set once per interval; the checks run outside it.
A caller whose operation is already settled when it comes to wait does not
take it at all.

Signals: Ctrl-C raises in the main thread while it waits, or between two calls
of the Python code around the wait.  Nothing a caller runs from its wait is
Python code that a ``KeyboardInterrupt`` could leave half done: it adds and
discards under a lock (``with``: released whatever is raised), rings the bell
with one ``release()``, and never starts the thread there (``Thread.start``
waits on a condition, and an interrupt inside ``Condition.wait`` can leave it
broken): a thread starts the watchdog when it makes its first blocking call
(:func:`~loopbridge._wakers.thread_waker`), before it waits.

Interpreter shutdown: from 3.12 on, no thread starts once the interpreter is
finalizing, ``atexit`` handlers included.  A blocking call made there with no
watchdog running checks its owner itself, every liveness interval, as every
blocked caller did before the watchdog.

Fork: only the forking thread exists in a child, and the watchdog thread is not
it.  ``os.register_at_fork(after_in_child=...)`` replaces the watchdog with a
fresh one (a new lock: another thread may have held the old one at the fork;
no thread: the next wait starts one; an empty set: the threads that parked on
the old one do not exist there).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from ._ports import LIVENESS_INTERVAL

__all__ = ["watched", "Watchdog", "THREAD_NAME"]

#: The watchdog thread's name (one per process, from the first blocking wait on).
THREAD_NAME = "loopbridge-watchdog"


class Watchdog:
    """The operations thread callers wait on, and the thread that checks their owners."""

    __slots__ = ("lock", "bell", "parked", "thread", "idle")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Held while the watchdog runs or sleeps; released (rung) by a caller that
        # parks while it sleeps (``idle``), once per sleep: its wake-up.
        self.bell = threading.Lock()
        self.bell.acquire()
        self.parked: set[Any] = set()  # under lock
        self.thread: threading.Thread | None = None  # under lock
        self.idle = False  # under lock: the thread sleeps, or is about to, on ``bell``

    def start(self) -> bool:
        """Start the watchdog thread unless it runs (a thread about to make its first
        blocking call: before its wait, where a Ctrl-C must find nothing half done).

        False: no thread can start (interpreter shutdown: an ``atexit`` handler
        on 3.12+); a caller then checks its owner itself while it waits.
        """
        with self.lock:
            if self.thread is None:
                thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # "can't create new thread at interpreter shutdown"
                    return False
                self.thread = thread
            return True

    def add(self, op: Any) -> None:
        """A thread caller blocks on ``op`` from now on (its own thread).

        A signal's handler (Ctrl-C) runs only after a call returns here, so it
        finds ``idle`` and ``bell`` as they were before or after this, never
        between: the flag is written, then the bell rung, by one C call.
        """
        with self.lock:
            self.parked.add(op)
            if self.idle:
                self.idle = False
                self.bell.release()

    def discard(self, op: Any) -> None:
        """The caller blocked on ``op`` stopped waiting (its own thread)."""
        with self.lock:
            self.parked.discard(op)

    def _run(self) -> None:
        """The watchdog thread: sleep while no one waits; check every interval otherwise."""
        while True:
            with self.lock:
                self.idle = not self.parked  # add() clears it, under this lock, as it rings
                sleeping = self.idle
            if sleeping:
                self.bell.acquire()  # until a caller parks: add() rings once per sleep
                continue
            time.sleep(LIVENESS_INTERVAL)  # a caller that just parked has a live owner
            with self.lock:
                owners = {op.owner for op in self.parked}
            self.check(owners)

    def check(self, owners: set[Any]) -> None:
        """Ask each owner whether its loop is alive (a dead one settles what it had)."""
        for owner in owners:
            if owner is None:
                continue
            try:
                owner.check_alive()
            except Exception:  # never lose the watchdog: the other owners need it
                _log.exception("loopbridge: the liveness check of %r failed", owner)


_log = logging.getLogger("loopbridge")
_watchdog = Watchdog()


def watched() -> Watchdog:
    """This process's watchdog (a forked child gets a fresh one)."""
    return _watchdog


def _after_fork_in_child() -> None:
    global _watchdog
    _watchdog = Watchdog()  # no thread: the next thread waker starts one


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
