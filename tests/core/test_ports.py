"""A port's wake states (``Wake``) and the function behind each transition.

The target port of each test belongs to a loop that never runs: what it
schedules is collected instead, so a test sees every wake it sends.  The posting
side is a real asyncio loop where deferral matters (it defers only while its
loop has more ready work).
"""

from __future__ import annotations

import asyncio
from typing import Any

import loopbridge as lb
from loopbridge._ports import Port, Wake, running_port

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
            # The owner's 64 results, each appended to this loop's inbox.
            all_posted = il.count("post.appended", 64, thread=asyncio_owner.thread)
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
