"""The watchdog of blocked thread callers (:mod:`loopbridge._watchdog`).

A caller blocked in a plain thread does not wake up to check its owner loop: one
watchdog thread per process does it for every such caller, and sleeps while none
waits.  A blocked caller still notices an owner loop that died, in a forked child
too.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import _watchdog
from loopbridge._ports import Port, port_for_loop

from .interleave import BOUND, wait_until_waiting
from .test_fork import _fork_and_report
from .test_wakers import Latch


async def _make_latch() -> Latch:
    return Latch()


class Checks:
    """``Port.check_alive`` wrapped: which threads asked, and an event once
    ``enough`` checks of ``port`` were made."""

    def __init__(self, port: Port, enough: int) -> None:
        self.port = port
        self.enough = enough
        self.threads: list[str] = []
        self.done = threading.Event()
        self.original = Port.check_alive

    def __call__(self, port: Port) -> bool:
        if port is self.port and not self.done.is_set():
            self.threads.append(threading.current_thread().name)
            if len(self.threads) >= self.enough:
                self.done.set()
        return self.original(port)


@pytest.fixture
def latch_owner() -> Iterator[tuple[lb.LoopThread, Latch]]:
    with lb.LoopThread(name="latch-owner") as owner:
        yield owner, owner.run(_make_latch)


def _blocked_caller(p: Latch, got: list[object]) -> threading.Thread:
    def caller() -> None:
        try:
            got.append(lb.blocking(p).wait())
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=caller, name="blocked-caller")
    t.start()
    wait_until_waiting(t)
    return t


def test_a_blocked_thread_caller_leaves_the_checks_to_the_watchdog(
    latch_owner: tuple[lb.LoopThread, Latch], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its thread blocks until woken: every liveness check of its owner while it
    waits is the watchdog's (the caller's own timed waits made them all before)."""
    owner, latch = latch_owner
    p = lb.proxy(latch)
    checks = Checks(port_for_loop(owner.loop), enough=3)
    monkeypatch.setattr(Port, "check_alive", lambda port: checks(port))
    got: list[object] = []
    t = _blocked_caller(p, got)
    assert checks.done.wait(BOUND), f"{checks.threads}: too few liveness checks"
    owner.run(latch.opened.set)
    t.join(BOUND)
    assert got == ["opened"]
    assert set(checks.threads) == {_watchdog.THREAD_NAME}, checks.threads


def _raw_owner() -> tuple[asyncio.AbstractEventLoop, threading.Thread, Latch]:
    """An owner loop on a plain thread that ``stop()`` ends without closing the loop
    or cancelling its tasks: no shutdown tells anyone; only a liveness check does."""
    loop = asyncio.new_event_loop()
    made: list[Latch] = []
    ready = threading.Event()

    def main() -> None:
        asyncio.set_event_loop(loop)
        made.append(loop.run_until_complete(_make_latch()))
        ready.set()
        loop.run_forever()  # returns at stop(); the loop is left open

    t = threading.Thread(target=main, name="raw-owner", daemon=True)
    t.start()
    assert ready.wait(BOUND)
    return loop, t, made[0]


def _stop_and_expect_closed(
    loop: asyncio.AbstractEventLoop, owner_thread: threading.Thread, latch: Latch
) -> str:
    """Block a caller on the raw owner, stop that loop (its thread ends), and return
    what the caller got: the name of what it raised, or its value."""
    p = lb.proxy(latch)
    got: list[object] = []
    t = _blocked_caller(p, got)
    assert latch.waiting.wait(BOUND)  # started on the owner: stopping leaves it pending there
    loop.call_soon_threadsafe(loop.stop)
    owner_thread.join(BOUND)
    t.join(BOUND)
    loop.close()
    return type(got[0]).__name__ if got and isinstance(got[0], BaseException) else repr(got)


def test_a_blocked_thread_caller_sees_its_owner_stop_and_its_thread_end() -> None:
    assert _stop_and_expect_closed(*_raw_owner()) == "OwnerLoopClosed"


def test_the_watchdog_sleeps_while_no_thread_caller_waits(
    latch_owner: tuple[lb.LoopThread, Latch],
) -> None:
    owner, latch = latch_owner
    p = lb.proxy(latch)
    got: list[object] = []
    t = _blocked_caller(p, got)
    watchdog = _watchdog.watched()
    thread = watchdog.thread
    assert thread is not None and thread.is_alive()
    owner.run(latch.opened.set)
    t.join(BOUND)
    assert got == ["opened"]
    assert _sleeping(thread), "the watchdog did not go back to sleep with no caller waiting"
    assert not watchdog.parked
    assert sum(th.name == _watchdog.THREAD_NAME for th in threading.enumerate()) == 1


def _sleeping(thread: threading.Thread) -> bool:
    """Whether ``thread`` comes to sleep on the watchdog's bell: idle, and in ``_run``
    with no Python frame above it (the bell's acquire, a C call)."""
    pause = threading.Event()
    for _ in range(int(BOUND / 0.005)):
        frame: Any = sys._current_frames().get(thread.ident or 0)
        if frame is not None and frame.f_code.co_name == "_run" and _watchdog.watched().idle:
            return True
        pause.wait(0.005)
    return False


def test_a_forked_child_gets_a_watchdog_of_its_own(
    latch_owner: tuple[lb.LoopThread, Latch],
) -> None:
    """Forked while a thread caller waits (the watchdog thread runs, and does not
    survive the fork): in the child, a blocked caller still sees its owner die."""
    owner, latch = latch_owner
    got: list[object] = []
    t = _blocked_caller(lb.proxy(latch), got)

    def child() -> dict[str, Any]:
        inherited = _watchdog.watched()
        fresh = not inherited.parked and inherited.thread is None
        return {"fresh": fresh, "got": _stop_and_expect_closed(*_raw_owner())}

    try:
        report = _fork_and_report(child)
    finally:
        owner.run(latch.opened.set)
        t.join(BOUND)
    assert got == ["opened"]
    assert report == {"fresh": True, "got": "OwnerLoopClosed"}


AT_EXIT = textwrap.dedent(
    """
    import asyncio, atexit, threading
    import loopbridge as lb
    from loopbridge import _watchdog

    @lb.loop_affine
    class Engine:
        async def echo(self, x: int) -> int:
            return x

    async def make() -> Engine:
        return Engine()

    owner = lb.LoopThread("owner").start()
    # Made without a blocking call: this thread's first one is the exit handler's.
    p = lb.proxy(asyncio.run_coroutine_threadsafe(make(), owner.loop).result())

    def at_exit() -> None:
        try:  # can a thread start here?  (not on 3.12)
            probe = threading.Thread(target=int)
            probe.start()
            probe.join()
            can = True
        except RuntimeError:
            can = False
        print(lb.blocking(p).echo(7), can, _watchdog.watched().thread is not None)
        owner.stop()

    atexit.register(at_exit)
    """
)


def test_a_blocking_call_at_interpreter_exit_works_without_a_watchdog() -> None:
    """On 3.12 no thread starts in an ``atexit`` handler: a blocking call made there,
    the thread's first, checks its owner itself rather than failing.  Where one
    can start, the watchdog does."""
    # A fresh interpreter's imports: seconds, but over a minute on a starved machine.
    proc = subprocess.run(
        [sys.executable, "-c", AT_EXIT], capture_output=True, text=True, timeout=240
    )
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    value, can_start, watchdog = proc.stdout.split()
    assert value == "7"
    assert watchdog == can_start  # the watchdog where a thread can start, else none
    if sys.version_info[:2] == (3, 12):
        assert can_start == "False"  # the case this test is for
