"""Transfers between an asyncio loop and a uvloop loop while other threads and
loops call and stream: no call is lost or run twice, none fails, both loops run
calls, and no task is left behind.

A proxy runs the member itself, not the affinity check's wrapper, so this test
sees a misroute only through its consequences; which loop a call may start on
around a transfer is forced, window by window, in test_transfer_windows.py.
Before the owner became one record swapped in one store, a transfer from a
stock loop to uvloop could be read half-done (the new loop with the stock loop's
thread-ident test) and raise ``AttributeError`` here.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
from collections.abc import AsyncIterator
from typing import Any

import loopbridge as lb

from .conftest import hang_dump, tasks_on, within

CALLS_PER_CALLER = 300
RETURNS_PER_TRANSFER = 4  # the callers wait for the mover to keep up (see record)


@lb.loop_affine
class Counter:
    def __init__(self) -> None:
        self.ran: collections.Counter[int] = collections.Counter()
        self.loops: collections.Counter[str] = collections.Counter()  # by library

    async def record(self, i: int) -> int:
        self.ran[i] += 1
        self.loops[type(asyncio.get_running_loop()).__module__.split(".")[0]] += 1
        await asyncio.sleep(0)  # suspend once: a transfer may land mid-call
        return i

    async def items(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


def test_transfers_between_asyncio_and_uvloop_lose_and_misroute_nothing() -> None:
    stock = lb.LoopThread(name="owner-asyncio", use_uvloop=False).start()
    fast = lb.LoopThread(name="owner-uvloop", use_uvloop=True).start()
    ids = itertools.count()
    errors: list[BaseException] = []
    returned: list[int] = []
    done = threading.Event()
    transfers = 0
    # Callers and mover keep pace: a transfer per RETURNS_PER_TRANSFER returns, so
    # transfers land among calls in flight however loaded the machine is (a mover
    # that spins starves the callers on two cores; one left unscheduled, the
    # callers finish with no transfer among them).  Neither waits while the other
    # may not go on: callers wait only while the mover is behind, the mover only
    # while it is one ahead.
    pace = threading.Condition()

    def callers_may_go() -> bool:  # the mover has kept up
        return done.is_set() or transfers >= len(returned) // RETURNS_PER_TRANSFER

    def mover_may_go() -> bool:  # it is at most one transfer ahead
        return done.is_set() or transfers <= len(returned) // RETURNS_PER_TRANSFER

    def record(value: int) -> None:
        with pace:
            returned.append(value)
            pace.notify_all()
            pace.wait_for(callers_may_go)

    def finish() -> None:
        with pace:
            done.set()
            pace.notify_all()

    try:

        async def make() -> Counter:
            return Counter()

        counter = stock.run(make)
        p = lb.proxy(counter, stream_window=8)

        def thread_caller() -> None:
            try:
                b = lb.blocking(p)
                for _ in range(CALLS_PER_CALLER):
                    i = next(ids)
                    record(b.record(i))
                with b.items(50) as s:
                    assert list(s) == list(range(50))
            except BaseException as exc:
                errors.append(exc)

        def loop_caller() -> None:
            async def main() -> None:
                async def calls() -> None:
                    for _ in range(CALLS_PER_CALLER):
                        i = next(ids)
                        # Waits on this loop's thread for the mover: it needs no loop.
                        record(await p.record(i))

                async def streams() -> None:
                    for n in (0, 1, 20, 100):
                        assert [x async for x in p.items(n)] == list(range(n))

                await within(asyncio.gather(calls(), streams()), 60, "loop caller")

            try:
                asyncio.run(main())
            except BaseException as exc:
                errors.append(exc)

        def transferrer() -> None:
            # Back and forth for as long as the callers run, in step with them.
            nonlocal transfers
            try:
                while True:
                    with pace:
                        pace.wait_for(mover_may_go)
                        if done.is_set():
                            return
                    lb.transfer(counter, (fast if transfers % 2 == 0 else stock).loop)
                    with pace:
                        transfers += 1
                        pace.notify_all()
            except BaseException as exc:
                errors.append(exc)

        callers = [threading.Thread(target=thread_caller) for _ in range(2)]
        callers += [threading.Thread(target=loop_caller) for _ in range(2)]
        mover = threading.Thread(target=transferrer)
        mover.start()
        for t in callers:
            t.start()
        for t in callers:
            t.join(90)
        finish()
        mover.join(30)
        hung = [t.name for t in (*callers, mover) if t.is_alive()]
        assert not hung, hang_dump(f"still running: {hung}")
        assert not errors, errors[:3]
        issued = next(ids)
        assert transfers >= issued // RETURNS_PER_TRANSFER, (transfers, issued)
        assert sorted(returned) == list(range(issued)), "a call was lost"
        ran: dict[int, int] = dict(counter.ran)
        assert ran == dict.fromkeys(range(issued), 1), "a call ran twice or never"
        assert set(counter.loops) == {"asyncio", "uvloop"}, counter.loops
        for loop in (stock.loop, fast.loop):
            tasks: set[Any] = tasks_on(loop)
            assert not tasks, tasks
    finally:
        finish()
        stock.stop()
        fast.stop()
