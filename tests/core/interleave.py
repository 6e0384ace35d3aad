"""A deterministic interleaving harness over loopbridge's named points
(:mod:`loopbridge._interleave`).

``with Interleaving() as il:`` installs the hook; ``il.hold(point)`` makes the
next thread that reaches ``point`` stop there; ``il.reached(point)`` waits until
it has; ``il.release(point)`` lets it go on.  ``il.count(point, n, thread)``
returns a countdown that ends once ``point`` has been passed ``n`` more times
(by ``thread`` only, and only passes after which ``when()`` holds, when given),
for a test that waits for a number of steps or for a state one step reaches;
``il.posted_to(port, n, thread)`` ends once ``thread`` has made ``port``'s
inbox hold ``n`` items.
Waits are on events, bounded, and a bound that expires fails the test instead
of hanging it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from loopbridge import _interleave

BOUND = 10.0


class Countdown:
    """``point`` passed ``n`` times (by ``thread`` only, and where ``when()`` holds
    after the pass, when given); see ``Interleaving.count``."""

    def __init__(
        self,
        point: str,
        n: int,
        thread: threading.Thread | None,
        when: Callable[[], bool] | None,
    ) -> None:
        self.point, self.left, self.thread, self.when = point, n, thread, when
        self.done = threading.Event()

    def counts(self, me: threading.Thread) -> bool:
        """Whether a pass by ``me`` counts (called under the harness's lock)."""
        if self.left == 0 or self.thread not in (None, me):
            return False
        return self.when is None or self.when()

    def wait(self) -> None:
        assert self.done.wait(BOUND), f"{self.point} was passed {self.left} times too few"


class Interleaving:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[threading.Event, threading.Event]] = {}
        self._counts: dict[str, Countdown] = {}
        self.passed: list[tuple[str, str]] = []  # (thread name, point), in order

    def __enter__(self) -> Interleaving:
        assert _interleave.hook is None, "another interleaving is installed"
        _interleave.hook = self._at
        return self

    def __exit__(self, *exc: object) -> None:
        _interleave.hook = None
        for _, release in self._held.values():
            release.set()  # never leave a thread parked behind a failed test

    def hold(self, point: str) -> None:
        """The next thread to reach ``point`` stops there until released."""
        with self._lock:
            self._held[point] = (threading.Event(), threading.Event())

    def reached(self, point: str) -> None:
        reached, _ = self._held[point]
        assert reached.wait(BOUND), f"no thread reached {point}"

    def release(self, point: str) -> None:
        self._held[point][1].set()

    def count(
        self,
        point: str,
        n: int,
        thread: threading.Thread | None = None,
        when: Callable[[], bool] | None = None,
    ) -> Countdown:
        """A countdown of the next ``n`` passes of ``point`` (by ``thread`` only, and
        only passes after which ``when()`` is true, when given); it replaces any
        earlier countdown of ``point``."""
        countdown = Countdown(point, n, thread, when)
        with self._lock:
            self._counts[point] = countdown
        return countdown

    def posted_to(self, port: Any, n: int, thread: threading.Thread) -> Countdown:
        """A countdown that ends at the pass of ``post.appended`` by ``thread`` after
        which ``port``'s inbox holds ``n`` items, for a test whose loop does not
        drain it meanwhile.  Posts to other ports do not count: a thread may post
        elsewhere at any time (a finaliser the collector runs there, on 3.13t)."""
        return self.count("post.appended", 1, thread, when=lambda: len(port._inbox) >= n)

    def _at(self, point: str) -> None:
        me = threading.current_thread()
        self.passed.append((me.name, point))
        with self._lock:
            countdown = self._counts.get(point)
            if countdown is not None and countdown.counts(me):
                countdown.left -= 1
                if countdown.left == 0:
                    countdown.done.set()
            gate = self._held.get(point)
            if gate is None or gate[0].is_set():
                return
            gate[0].set()
        assert gate[1].wait(BOUND), f"{point} was never released"


@contextmanager
def paused_at(il: Interleaving, point: str, action: Callable[[], Any]) -> Iterator[list[Any]]:
    """Run ``action`` on a thread of its own until it reaches ``point``; the body
    runs while it is stopped there; on exit it goes on and is joined.  Yields a
    list holding the action's result or exception once it has finished."""
    il.hold(point)
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(action())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, name=f"paused at {point}")
    t.start()
    il.reached(point)
    try:
        yield out
    finally:
        il.release(point)
        t.join(BOUND)
        assert not t.is_alive(), f"the thread paused at {point} did not finish"


def wait_until_waiting(thread: threading.Thread) -> None:
    """Until ``thread`` waits in a blocking call's wait (``ThreadWaker.wait``, read
    from its stack): a point with no hook, since the wait is where a signal lands."""
    deadline = time.perf_counter() + BOUND
    ident = thread.ident
    assert ident is not None
    while time.perf_counter() < deadline:
        frame = sys._current_frames().get(ident)
        while frame is not None:
            if frame.f_code.co_name == "wait" and "_wakers" in frame.f_code.co_filename:
                return
            frame = frame.f_back
        threading.Event().wait(0.001)
    raise AssertionError(f"{thread.name} never waited in a blocking call")


#: How often :func:`ctrl_c` sends the signal again while its handler has not run.
RESEND = 0.01


def ctrl_c(thread: threading.Thread, raised: threading.Event) -> None:
    """Ctrl-C, a real SIGINT, into ``thread``'s blocking wait, sent again every
    :data:`RESEND` until its handler has run (``raised``: the ``ctrl_c_raises``
    fixture's, whose handler raises once).  A signal that lands after the thread's
    last check for signals and before it blocks in ``lock.acquire()`` is seen only
    when that wait ends (CPython checks for them when a blocking acquire is
    interrupted, not before it blocks); the next one interrupts the wait."""
    ident = thread.ident
    assert ident is not None
    deadline = time.perf_counter() + BOUND
    while time.perf_counter() < deadline:
        signal.pthread_kill(ident, signal.SIGINT)
        if raised.wait(RESEND):
            return
    raise AssertionError(f"no SIGINT reached {thread.name}'s handler")
