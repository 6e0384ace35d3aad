"""The cancellation contract: a result that completed is never silently dropped.

When a caller's cancel (or a blocking call's timeout) races a call that has
already settled OK on its owner, the caller gets the value, and the cancel is
re-delivered at its next suspension unless a cancel scope consumed it
(``asyncio.timeout``, ``wait_for``); under trio the cancelled scope cancels the
next checkpoint itself.  The case that showed it: ``wait_for(q.get(), t)``
through a proxy of an owner's ``asyncio.Queue`` (an ``Owned`` result), where a
get that had taken its item raised ``CancelledError`` and the item was gone.

The races are forced at named points (``interleave.py``): the owner has
recorded the outcome and posted the caller's wake before the caller's cancel
is delivered.  A statistical test then runs the user's own loop of timed gets.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from typing import Any

import pytest
import trio
import trio.testing

import loopbridge as lb
import loopbridge.metrics
from loopbridge._ports import running_port
from loopbridge._trio import trio_port

from .interleave import BOUND, Interleaving, ctrl_c, wait_until_waiting


@lb.loop_affine(returns={"queue": lb.Owned()})
class Broker:
    """Hands out its queue as an ``Owned`` result: a proxy of an asyncio.Queue."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[int] = asyncio.Queue()

    async def queue(self) -> asyncio.Queue[int]:
        return self._queue

    async def fill(self, n: int) -> None:
        for i in range(n):
            self._queue.put_nowait(i)

    async def left(self) -> int:
        return self._queue.qsize()


def _broker(owner: lb.LoopThread) -> tuple[Broker, Broker]:
    async def make() -> Broker:
        return Broker()

    broker = owner.run(make)
    return broker, lb.proxy(broker)


async def _parked() -> None:
    """Let a task just created submit its call and park; send the start's wake-up,
    which this loop defers to the end of its iteration, now (this loop blocks next)."""
    await asyncio.sleep(0)
    running_port(asyncio.get_running_loop()).flush_deferred()


def _queue_counters(q: object) -> dict[str, Any]:
    return lb.metrics.metrics_of(q).snapshot()


def test_a_task_cancelled_after_the_get_settled_gets_the_item_then_the_cancel(
    owner: lb.LoopThread,
) -> None:
    _, p = _broker(owner)
    got: list[Any] = []

    async def main() -> None:
        q = await p.queue()
        await p.fill(1)

        async def getter() -> None:
            got.append(await q.get())
            try:
                await asyncio.sleep(0)  # the cancel is re-delivered here
            except asyncio.CancelledError as exc:
                got.append(exc.args)
                raise
            got.append("not cancelled")

        with Interleaving() as il:
            # The owner's post of the getter's wake: its outcome is recorded.
            settled = il.posted_to(running_port(asyncio.get_running_loop()), 1, owner.thread)
            task = asyncio.create_task(getter())
            await _parked()
            settled.wait()  # blocks this loop: the wake is not run yet
            task.cancel("late")
            with pytest.raises(asyncio.CancelledError):
                await task
        assert got == [0, ("late",)], "the item the owner's get() took was dropped"
        assert _queue_counters(q)["delivered_despite_cancel"] == 1

    asyncio.run(main())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout is 3.11+")
def test_an_expired_timeout_scope_gives_the_item_and_consumes_its_cancel(
    owner: lb.LoopThread,
) -> None:
    _, p = _broker(owner)
    got: list[Any] = []

    async def main() -> None:
        q = await p.queue()
        await p.fill(1)
        scopes: list[asyncio.Timeout] = []

        async def getter() -> None:
            async with asyncio.timeout(BOUND * 3) as scope:
                scopes.append(scope)
                got.append(await q.get())
            got.append(scope.expired())
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            got.append("ran on")  # the scope consumed the cancel: none is re-delivered

        with Interleaving() as il:
            settled = il.posted_to(running_port(asyncio.get_running_loop()), 1, owner.thread)
            task = asyncio.create_task(getter())
            await _parked()
            settled.wait()
            scopes[0].reschedule(asyncio.get_running_loop().time() - 1)  # it expires now
            await task
        assert got == [0, True, "ran on"]

    asyncio.run(main())


def test_a_trio_scope_cancelled_after_the_get_settled_gets_the_item(
    asyncio_owner: lb.LoopThread,
) -> None:
    _, p = _broker(asyncio_owner)
    got: list[Any] = []

    async def main() -> None:
        q = await p.queue()
        await p.fill(1)
        scope = trio.CancelScope()

        async def getter() -> None:
            with scope:
                got.append(await q.get())
            got.append(scope.cancelled_caught)

        with Interleaving() as il:
            il.hold("settle.latched")  # the owner took the item and is recording it
            settled = il.posted_to(trio_port(), 1, asyncio_owner.thread)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(getter)
                await trio.testing.wait_all_tasks_blocked()  # the getter is parked
                # This run stays blocked from here to the nursery's end: the
                # getter sees its cancel before the wake the owner posts.
                il.reached("settle.latched")
                scope.cancel()
                il.release("settle.latched")
                settled.wait()  # the outcome is recorded and the wake posted
        assert got == [0, False]

    trio.run(main)
    assert lb.blocking(p).left() == 0


def test_a_blocking_timeout_that_loses_to_the_result_returns_it(
    asyncio_owner: lb.LoopThread,
) -> None:
    _, p = _broker(asyncio_owner)
    q = lb.blocking(p).queue()
    lb.blocking(p).fill(1)
    out: list[Any] = []

    def get() -> None:
        try:
            out.append(lb.blocking(q, timeout=0.2).get())
        except BaseException as exc:
            out.append(exc)

    with Interleaving() as il:
        il.hold("settle.latched")  # the owner took the item and is recording it
        t = threading.Thread(target=get, name="getter")
        # The getter's posts: the get()'s start, then (timed out) its cancel.
        gave_up = il.count("post.appended", 2, thread=t)
        t.start()
        il.reached("settle.latched")
        gave_up.wait()
        il.release("settle.latched")
        t.join(BOUND)
    assert out == [0]
    assert _queue_counters(q)["delivered_despite_cancel"] == 1


def test_a_keyboard_interrupt_drops_a_completed_result_and_counts_it(
    asyncio_owner: lb.LoopThread, ctrl_c_raises: threading.Event
) -> None:
    _, p = _broker(asyncio_owner)
    q = lb.blocking(p).queue()
    lb.blocking(p).fill(1)
    main_thread = threading.current_thread()

    def interrupt(il: Interleaving) -> None:
        il.reached("settle.latched")
        wait_until_waiting(main_thread)  # the interrupt lands in the call's wait
        ctrl_c(main_thread, ctrl_c_raises)  # Ctrl-C: a real signal
        given_up.wait()  # the main thread asked for the cancel: the owner may go on
        il.release("settle.latched")

    with Interleaving() as il:
        il.hold("settle.latched")
        given_up = il.count("post.appended", 2, thread=main_thread)  # start, cancel
        helper = threading.Thread(target=interrupt, args=(il,), name="interrupter")
        helper.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                lb.blocking(q).get()
        finally:
            helper.join(BOUND)
    counters = _queue_counters(q)
    assert counters["results_dropped"] == 1
    assert counters["delivered_despite_cancel"] == 0


@pytest.mark.parametrize("caller", ["wait_for", "task.cancel"])
def test_timed_gets_lose_no_item(owner: lb.LoopThread, caller: str) -> None:
    """The user's loop: many gets, each behind a timeout of 0.05 to 0.5 ms; every
    item put is either got or still in the queue."""
    puts = 2_000
    _, p = _broker(owner)
    rng = random.Random(52)

    async def main() -> int:
        q = await p.queue()
        await p.fill(puts)
        got = 0
        for _ in range(puts):
            timeout = rng.uniform(0.00005, 0.0005)
            try:
                if caller == "wait_for":
                    await asyncio.wait_for(q.get(), timeout)
                else:
                    await _cancelled_after(q.get(), timeout)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                continue
            got += 1
        return got

    got = asyncio.run(main())
    left = lb.blocking(p).left()
    assert got + left == puts, f"{puts - got - left} items lost ({got} got, {left} left)"


async def _cancelled_after(aw: Any, seconds: float) -> Any:
    """Await ``aw`` in a task cancelled after ``seconds``: the task's result if it
    has one (a re-delivered cancel arrives after it), else its cancel."""
    task = asyncio.ensure_future(aw)
    asyncio.get_running_loop().call_later(seconds, task.cancel)
    return await task
