"""A wake that a loop defers to the end of its iteration is never lost.

A port defers the wake of another loop while its own loop has more ready work,
and sends it from a flush one iteration later.  A loop can stop in the iteration
that deferred and never run that flush: ``loop.stop()`` then ``loop.close()``,
or a loop driven by ``run_until_complete`` that is not run again.  Each test
forces that order with the member itself (it makes more work ready, then stops
its own loop in the same step), so the deferral and the stop happen on every
run, not by timing.  Before the fix each of these waited until its own timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import trio

import loopbridge as lb

BOUND = 5.0  # each test's own bound on a wait that used to be endless


def _stop_after_this_step() -> None:
    """Make more work ready on the running loop (so a wake posted now is
    deferred), and stop the loop at the end of this iteration."""
    loop = asyncio.get_running_loop()
    loop.call_soon(lambda: None)
    loop.stop()


@lb.loop_affine
class Stopper:
    async def echo_then_stop(self, value: Any) -> Any:
        _stop_after_this_step()
        return value

    async def echo(self, value: Any) -> Any:
        return value

    async def items_then_stop(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            if i == n - 1:
                _stop_after_this_step()
            yield i


class OwnerThread:
    """An owner loop on a thread, driven the plain way: ``run_forever()`` until
    stopped, then ``close()`` with no further iteration (what LoopThread's
    clean shutdown would otherwise hide)."""

    def __init__(self, then: Callable[[asyncio.AbstractEventLoop], None] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopped = threading.Event()
        self._then = then
        ready = threading.Event()
        self.obj: Stopper | None = None

        def main() -> None:
            asyncio.set_event_loop(self.loop)

            async def make() -> None:
                self.obj = Stopper()

            self.loop.run_until_complete(make())
            ready.set()
            self.loop.run_forever()
            self.stopped.set()
            if self._then is not None:
                self._then(self.loop)
            else:
                self.loop.close()

        self.thread = threading.Thread(target=main, name="plain-owner", daemon=True)
        self.thread.start()
        assert ready.wait(BOUND)

    def proxy(self) -> Stopper:
        assert self.obj is not None
        p = lb.proxy(self.obj)
        assert lb.blocking(p).echo(0) == 0  # the owner's port exists and has run
        return p


@pytest.fixture
def closing_owner() -> Iterator[OwnerThread]:
    owner = OwnerThread()
    yield owner
    owner.thread.join(BOUND)


def test_result_wake_deferred_by_an_owner_that_closes_reaches_an_asyncio_caller(
    closing_owner: OwnerThread,
) -> None:
    p = closing_owner.proxy()

    async def main() -> Any:
        return await asyncio.wait_for(p.echo_then_stop("done"), BOUND)

    assert asyncio.run(main()) == "done"
    assert closing_owner.stopped.is_set()


def test_result_wake_deferred_by_an_owner_that_closes_reaches_a_trio_caller(
    closing_owner: OwnerThread,
) -> None:
    p = closing_owner.proxy()
    got: list[Any] = []

    async def main() -> None:
        with trio.fail_after(BOUND):
            got.append(await p.echo_then_stop("done"))

    trio.run(main)
    assert got == ["done"]


def test_stream_wake_deferred_by_an_owner_that_closes_reaches_the_consumer(
    closing_owner: OwnerThread,
) -> None:
    p = closing_owner.proxy()

    async def main() -> list[int]:
        async def consume() -> list[int]:
            # The last item is appended in the step that stops the owner; the
            # stream's end never comes (the owner closes with the pump
            # suspended), so take exactly the items sent.
            out: list[int] = []
            async for x in p.items_then_stop(3):
                out.append(x)
                if x == 2:
                    break
            return out

        return await asyncio.wait_for(consume(), BOUND)

    assert asyncio.run(main()) == [0, 1, 2]


def test_owner_stopped_by_run_until_complete_style_still_delivers() -> None:
    """A loop that stops without closing may run again later; a caller waiting
    for a result it already produced does not wait for that."""
    owner = OwnerThread(then=lambda loop: None)  # stopped, left open, not run again
    p = owner.proxy()

    async def main() -> Any:
        return await asyncio.wait_for(p.echo_then_stop(7), BOUND)

    try:
        assert asyncio.run(main()) == 7
    finally:
        owner.thread.join(BOUND)
        owner.loop.close()


def test_start_deferred_by_a_caller_loop_that_closes_does_not_wedge_the_owner() -> None:
    """A caller loop defers the wake of the owner's port and closes before its
    flush: the owner's pending-wake flag must not stay up for everyone else."""
    with lb.LoopThread(name="owner") as owner:

        async def make() -> Stopper:
            return Stopper()

        p = lb.proxy(owner.run(make))
        caller = asyncio.new_event_loop()
        caller.run_until_complete(p.echo(0))  # an ordinary call: the caller's port exists
        pending: list[Any] = []

        async def submit_then_stop() -> None:
            coro = p.echo(1)
            # Run the call's first step here, in a step of this loop with more
            # work ready: it submits, and the owner's wake is deferred.
            _stop_after_this_step()
            pending.append((coro, coro.send(None)))

        step = caller.create_task(submit_then_stop())
        caller.run_forever()  # one iteration, then stopped: its flush is not run
        try:
            result: list[Any] = []
            t = threading.Thread(target=lambda: result.append(lb.blocking(p).echo(2)), daemon=True)
            t.start()
            t.join(BOUND)
            assert not t.is_alive(), "a thread caller waited on an owner whose wake was lost"
            assert result == [2]
        finally:
            assert step.done()
            for coro, _ in pending:
                coro.close()
            for task in asyncio.all_tasks(caller):
                task.cancel()
            caller.run_until_complete(asyncio.sleep(0))
            caller.close()
