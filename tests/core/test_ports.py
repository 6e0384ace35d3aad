"""Ports: the wake states (``Wake``) and the function behind each transition,
wake-ups shared by a batch, and the owner's liveness.

In the first section the target port of each test belongs to a loop that never
runs: what it schedules is collected instead, so a test sees every wake it sends.
The posting side is a real asyncio loop where deferral matters (it defers only
while its loop has more ready work).  The later sections, marked, run real owner
loops: a batch's wake-ups, and what callers see when an owner loop dies.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from typing import Any

import pytest

import loopbridge as lb
from loopbridge._ownership import ownership_of
from loopbridge._ports import PORT_ATTR, Port, Wake, running_port

from .conftest import Engine, until_set
from .conftest import make_engine as _make
from .interleave import Interleaving


class NeverRuns:
    """A loop that never runs: what is scheduled on it is collected instead."""


def _port() -> tuple[Port, list[Any]]:
    scheduled: list[Any] = []
    return Port(NeverRuns(), scheduled.append, "test loop"), scheduled


def _more_ready_then(step: Any) -> Any:
    """Run ``step()`` inside a task step of a fresh asyncio loop that has more
    ready work (so a post from it is deferred); return what it returned."""

    async def main() -> Any:
        running_port(asyncio.get_running_loop())  # the posting loop's port exists
        asyncio.get_running_loop().call_soon(lambda: None)
        return step()

    return asyncio.run(main())


def test_a_post_to_an_idle_port_schedules_one_drain_for_the_whole_batch() -> None:
    port, scheduled = _port()
    ran: list[int] = []
    assert port.wake_state is Wake.IDLE
    port.post(ran.append, 1)  # no running loop here: the wake is sent at once
    assert port.wake_state is Wake.SCHEDULED and len(scheduled) == 1
    port.post(ran.append, 2)
    port.post(ran.append, 3)
    assert len(scheduled) == 1 and port.wakeups == 1  # later posts only append
    scheduled.pop()()  # the drain
    assert port.wake_state is Wake.IDLE and ran == [1, 2, 3]
    port.post(ran.append, 4)  # idle again: the next post wakes the loop again
    assert len(scheduled) == 1 and port.wakeups == 2


def test_a_post_from_a_loop_with_more_ready_work_is_owed_until_that_loops_flush() -> None:
    targets = [_port(), _port()]

    async def main() -> list[tuple[Wake, Any, int]]:
        loop = asyncio.get_running_loop()
        here = running_port(loop)
        loop.call_soon(lambda: None)  # more ready work: posting defers the wakes
        for port, _ in targets:
            port.post(print, None)
        owed = [(p.wake_state, p.debtor, len(s)) for p, s in targets]
        assert all(state is Wake.OWED and debtor is here and n == 0 for state, debtor, n in owed)
        assert all(p.check_alive() for p, _ in targets)  # the debtor runs: not paid by this
        assert [p.wake_state for p, _ in targets] == [Wake.OWED, Wake.OWED]
        await asyncio.sleep(0)  # the end of this iteration: the flush pays both
        return [(p.wake_state, p.debtor, len(s)) for p, s in targets]

    assert asyncio.run(main()) == [(Wake.SCHEDULED, None, 1), (Wake.SCHEDULED, None, 1)]


def test_an_owed_wake_is_paid_by_a_liveness_check_once_its_debtor_has_stopped() -> None:
    port, scheduled = _port()
    loop = asyncio.new_event_loop()

    async def post_then_stop() -> None:
        running_port(loop)
        loop.call_soon(lambda: None)
        port.post(print, None)  # deferred: this loop owes the wake
        loop.stop()  # ... and stops before the flush that would pay it

    try:
        task = loop.create_task(post_then_stop())
        loop.run_forever()
        assert task.done() and port.wake_state is Wake.OWED and not scheduled
        assert port.check_alive()  # whoever waits on the port asks this
        assert port.wake_state is Wake.SCHEDULED and port.debtor is None
        assert len(scheduled) == 1
    finally:
        for t in asyncio.all_tasks(loop):
            t.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


def test_a_loop_blocked_in_a_blocking_call_never_owes_a_wake() -> None:
    port, scheduled = _port()

    def step() -> tuple[Wake, int]:
        here = running_port(asyncio.get_running_loop())
        here.blocked = object()  # what call_from_thread records while it blocks
        try:
            port.post(print, None)
        finally:
            here.blocked = None
        return port.wake_state, len(scheduled)

    assert _more_ready_then(step) == (Wake.SCHEDULED, 1)


def test_a_dead_loop_never_owes_a_wake() -> None:
    port, scheduled = _port()

    def step() -> tuple[Wake, int]:
        here = running_port(asyncio.get_running_loop())
        here.dead = RuntimeError("shut down")  # what die() records first
        port.post(print, None)
        return port.wake_state, len(scheduled)

    assert _more_ready_then(step) == (Wake.SCHEDULED, 1)


# ------------------------------------- wake-ups of real loops, shared by a batch
def test_concurrent_calls_share_wake_ups(asyncio_owner: lb.LoopThread) -> None:
    """64 calls made in one loop iteration wake the owner loop once, and their 64
    results, posted while the caller's loop is busy, wake the caller once.

    The caller's loop is kept busy (blocked on an event) from the owner's wake
    until the owner has posted every result, so the counts do not depend on how
    the two threads are scheduled.  How often an idle caller on another core is
    woken is a matter of timing (``bench_bridge.py --count-wakes`` measures it).
    """
    from loopbridge._ports import port_for_loop

    p = lb.proxy(asyncio_owner.run(_make))
    owner_port = port_for_loop(asyncio_owner.loop)

    async def main(il: Interleaving) -> tuple[int, int]:
        caller_port = port_for_loop(asyncio.get_running_loop())
        await p.echo(0)  # warm up: ports exist
        before = owner_port.wakeups, caller_port.wakeups
        for _ in range(20):
            # The owner's 64 results in this loop's inbox (its posts to other
            # ports, such as a finaliser's, do not count: one ended a count of
            # the owner's next 64 posts a result early in 1 3.13t soak run of 23).
            all_posted = il.posted_to(caller_port, 64, asyncio_owner.thread)
            woken = owner_port.wakeups
            calls = asyncio.gather(*(p.echo(i) for i in range(64)))
            # The calls submit in the next iteration, and their one wake of the
            # owner goes in the iteration after (the flush they deferred).  Let
            # both pass, then hold this loop until all 64 results are in its inbox.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert owner_port.wakeups == woken + 1
            all_posted.wait()
            assert await calls == list(range(64))
        return owner_port.wakeups - before[0], caller_port.wakeups - before[1]

    with Interleaving() as il:
        to_owner, to_caller = asyncio.run(main(il))
    # 1280 calls: without batching that is 1280 wake-ups each way.
    assert (to_owner, to_caller) == (20, 20)


def test_results_posted_from_the_drain_are_not_deferred(asyncio_owner: lb.LoopThread) -> None:
    """An eager call that finishes in the owner's drain posts its result from there.

    Woken by another thread, the owner loop still has its self-pipe reader
    queued behind the drain.  That reader posts nothing, so it is no reason to
    defer the caller's wake-up to a flush one loop iteration later.
    """
    from loopbridge._ports import port_for_loop

    p = lb.proxy(asyncio_owner.run(_make), eager=True)
    loop = asyncio_owner.loop
    owner_port = port_for_loop(loop)
    flushes: list[object] = []
    schedule = loop.call_soon

    def call_soon(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        if callback == owner_port._flush:
            flushes.append(callback)
        return schedule(callback, *args, **kwargs)

    async def main() -> None:
        assert await p.echo(0) == 0  # warm up: ports exist
        loop.call_soon = call_soon  # type: ignore[method-assign]
        try:
            for i in range(50):
                assert await p.echo(i) == i
        finally:
            del loop.call_soon

    asyncio.run(main())
    # One flush per call when the reader counted as more work; a flush is
    # still right when something else happens to be ready on the owner loop.
    assert len(flushes) < 10, len(flushes)


# ---------------------------------------------------------- owner liveness
# Owner death: pending calls and streams fail promptly with OwnerLoopClosed; an
# owner that is only stopped is not dead.
def test_asyncio_run_owner_returning_fails_pending_calls() -> None:
    box: dict[str, Any] = {}
    ready = threading.Event()

    def owner_main() -> None:
        async def main() -> None:
            box["engine"] = Engine()
            box["loop"] = asyncio.get_running_loop()
            box["release"] = release = asyncio.Event()
            ready.set()
            await release.wait()

        asyncio.run(main())

    t = threading.Thread(target=owner_main)
    t.start()
    ready.wait()
    p = lb.proxy(box["engine"])

    async def main() -> None:
        call = asyncio.create_task(p.sleep(30))
        await until_set(box["engine"].started["sleep"])
        # asyncio.run returns: tasks cancelled, loop closed
        box["loop"].call_soon_threadsafe(box["release"].set)
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(call, 5)

    asyncio.run(main())
    t.join()


class SteppedOwner:
    """An owner loop run in rounds on one thread (``run_forever`` until stopped, then
    again when resumed), as a loop driven by repeated ``run_until_complete`` is."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopped = threading.Event()
        self._resume = threading.Event()
        self._quit = False
        self.thread = threading.Thread(target=self._main, name="stepped-owner")

        async def make() -> Engine:
            return Engine()

        self.engine = self.loop.run_until_complete(make())
        self.thread.start()

    def _main(self) -> None:
        while True:
            self.loop.run_forever()
            self.stopped.set()
            if self._quit:
                return
            assert self._resume.wait(30)
            self._resume.clear()
            self.stopped.clear()

    def stop(self, quit: bool = False) -> None:
        self._quit = quit
        self.loop.call_soon_threadsafe(self.loop.stop)
        assert self.stopped.wait(30)

    def resume(self) -> None:
        self._resume.set()


def test_a_stopped_owner_is_not_dead_calls_run_when_it_runs_again() -> None:
    owner = SteppedOwner()
    p = lb.proxy(owner.engine)
    b = lb.blocking(p)
    assert b.echo(1) == 1  # the owner's port exists and has run
    ownership = ownership_of(owner.engine)
    assert ownership is not None
    port = ownership.port()
    owner.stop()
    done = threading.Event()

    async def main() -> Any:
        call = asyncio.create_task(p.echo(2))
        await asyncio.sleep(0)  # submitted: waits for a loop that is only stopped
        # What the waiting caller's liveness checks do, as many times as they like:
        # a stopped loop whose thread lives is not dead (it was after two checks).
        for _ in range(5):
            assert await asyncio.to_thread(port.check_alive)
        assert not call.done()
        done.set()
        owner.resume()
        return await call

    assert asyncio.run(main()) == 2
    assert done.is_set()
    owner.stop(quit=True)
    owner.thread.join(30)
    # Stopped, and the thread that ran it has ended: now it is dead.
    with pytest.raises(lb.OwnerLoopClosed):
        b.echo(3)
    owner.loop.close()
    with pytest.raises(lb.OwnerLoopClosed):
        b.echo(4)


def test_a_loop_closed_without_the_shutdown_sweep_is_freed_with_its_port(
    asyncio_owner: lb.LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller loop driven by ``run_until_complete`` and closed without cancelling
    its tasks first (no ``asyncio.run`` sweep): its port never died, and once the
    user lets the loop go the collector frees both (the registry held the port,
    and the port its loop, for the process's life).  The task loopbridge kept on
    it is no task of the user's: asyncio does not report it destroyed while pending."""
    p = lb.proxy(asyncio_owner.run(_make))
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(p.echo(1)) == 1  # this loop's port and its keeper exist
    port = weakref.ref(getattr(loop, PORT_ATTR))
    freed = weakref.ref(loop)
    loop.close()
    del loop
    # The owner thread may still hold the call, and through it this loop's port, for
    # the rest of the callback that posted its result (on 3.13t, 5 of 300 collections
    # run then found the loop alive): a later step on the owner loop ends it.
    asyncio_owner.run(_nothing)
    gc.collect()
    assert (freed(), port()) == (None, None)
    destroyed = [
        r.getMessage() for r in caplog.records if "destroyed but it is pending" in r.getMessage()
    ]
    assert destroyed == []


async def _nothing() -> None:
    """One step on the owner loop: every callback it ran before has returned."""
