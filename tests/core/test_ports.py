"""A port's wake states (``Wake``) and the function behind each transition.

The target port of each test belongs to a loop that never runs: what it
schedules is collected instead, so a test sees every wake it sends.  The posting
side is a real asyncio loop where deferral matters (it defers only while its
loop has more ready work).
"""

from __future__ import annotations

import asyncio
from typing import Any

from loopbridge._ports import Port, Wake, running_port


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
