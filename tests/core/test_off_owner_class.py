"""Nothing runs off its owner: every way a callable could, one test each, and a
state machine over call / stream / cancel / close / transfer.

The ways owner-side code could run on a loop that does not own its object:

1. a call submitted before a transfer, started after it (the old owner's doorway);
2. a call whose task is made before a transfer and takes its first step after it
   (the window between the doorway and the first step);
3. a result that holds loop-bound state below its first level, crossing bare
   (covered where an object handed out under a rule gives it; a result no rule
   covers meets the always-on check, one level deep);
4. what an object handed out under a rule gives back (entered, awaited, iterated,
   an async member's result), crossing bare;
5. the advice of a refusal, followed literally, leading to code that runs off the
   owner;
6. a pending result (a sync member with a rule) made off the owner.

Each test records, in the owner-side code itself, the loop it runs on against the
object's owner at that moment.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import loopbridge as lb

from .conftest import tasks_on
from .interleave import BOUND, Interleaving, paused_at


class Record:
    """Where owner-side code ran: (loop, owned by it then)."""

    def __init__(self) -> None:
        self.ran: list[tuple[asyncio.AbstractEventLoop, bool]] = []

    def here(self, obj: object) -> None:
        loop = asyncio.get_running_loop()
        self.ran.append((loop, lb.owner_loop(obj) is loop))

    def off_owner(self) -> list[tuple[asyncio.AbstractEventLoop, bool]]:
        return [r for r in self.ran if not r[1]]


class Conn:
    """Loop-bound state several objects down, as a client's connection keeps it."""

    def __init__(self) -> None:
        self.inner = {"waiters": [asyncio.Event()]}


class Handle:
    def __init__(self, box: Box) -> None:
        self.box = box
        self.conn = [Conn()]

    async def read(self) -> int:
        self.box.rec.here(self.box)
        return len(self.conn)

    async def again(self) -> Handle:
        self.box.rec.here(self.box)
        return Handle(self.box)

    async def __aenter__(self) -> Handle:
        return Handle(self.box)  # another object, bound below its first level

    async def __aexit__(self, *exc: object) -> None:
        self.box.rec.here(self.box)


class Box:
    def __init__(self) -> None:
        self.rec = Record()
        self.q: asyncio.Queue[int] = asyncio.Queue()
        self.get_started = threading.Event()
        #: Called on the owner when wait() has started (a test's own signal).
        self.on_wait: Callable[[], object] | None = None

    async def put(self, x: int) -> None:
        self.rec.here(self)
        self.q.put_nowait(x)

    async def get(self) -> int:
        self.rec.here(self)
        self.get_started.set()
        x = await self.q.get()
        self.rec.here(self)
        return x

    async def wait(self) -> None:
        self.rec.here(self)
        self.get_started.set()
        if self.on_wait is not None:
            self.on_wait()
        await asyncio.Event().wait()  # until cancelled

    async def items(self, n: int) -> AsyncIterator[int]:
        self.rec.here(self)
        for _ in range(n):
            x = await self.q.get()
            self.rec.here(self)
            yield x

    async def handle(self) -> Handle:
        self.rec.here(self)
        return Handle(self)

    def open(self) -> Handle:
        self.rec.here(self)
        return Handle(self)


@lb.loop_affine
class AffineBox(Box):
    pass


@pytest.fixture
def owners() -> Iterator[tuple[lb.LoopThread, lb.LoopThread]]:
    a = lb.LoopThread(name="owner-a").start()
    b = lb.LoopThread(name="owner-b").start()
    yield a, b
    a.stop()
    b.stop()


def _box(owner: lb.LoopThread, **returns: lb.Owned) -> Box:
    async def make() -> Box:
        return lb.adopt(Box(), returns=returns) if returns else AffineBox()

    return owner.run(make)


# ------------------------------------------------------------- one test each
def test_1_submitted_before_a_transfer_runs_on_the_new_owner(
    owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = owners
    box = _box(a)
    p = lb.proxy(box)
    lb.blocking(p).put(0)  # a's port is up
    with Interleaving() as il, paused_at(il, "submit.registered", lambda: lb.blocking(p).put(1)):
        lb.transfer(box, b.loop)
    assert not box.rec.off_owner()
    assert box.rec.ran[-1] == (b.loop, True)


def test_2_a_task_made_before_a_transfer_starts_on_the_new_owner(
    owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = owners
    box = _box(a)
    p = lb.proxy(box)
    lb.blocking(p).put(0)
    made, go = threading.Event(), threading.Event()
    armed: list[bool] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
        task = asyncio.Task(coro, loop=loop, **kw)
        if armed and armed.pop():
            made.set()
            assert go.wait(BOUND)
        return task

    a.loop.call_soon_threadsafe(a.loop.set_task_factory, factory)
    lb.blocking(p).put(1)  # the factory is in place (this task was made before arming)
    armed[:] = [True]
    t = threading.Thread(target=lambda: lb.blocking(p).put(2))
    t.start()
    assert made.wait(BOUND)
    lb.transfer(box, b.loop)
    go.set()
    t.join(BOUND)
    a.loop.call_soon_threadsafe(a.loop.set_task_factory, None)
    assert not box.rec.off_owner()
    assert box.rec.ran[-1] == (b.loop, True)


def test_3_a_result_bound_below_its_first_level_does_not_cross_bare(
    owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    """What a covered object's async member gives, bound four objects down."""
    a, _ = owners
    box = _box(a, open=lb.Owned())
    p = lb.proxy(box)

    async def main() -> int:
        async with p.open() as h:
            h2 = await h.again()
            assert lb.is_proxy(h2)
            return int(await h2.read())

    assert asyncio.run(main()) == 1
    assert box.rec.ran and not box.rec.off_owner()


def test_4_what_an_owned_object_gives_is_covered_at_every_depth(
    owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, _ = owners
    box = _box(a, open=lb.Owned())
    p = lb.proxy(box)

    async def entered() -> int:
        async with p.open() as h:  # entering gives another Handle: a proxy too
            assert lb.is_proxy(h)
            return int(await h.read())

    assert asyncio.run(entered()) == 1
    assert box.rec.ran and not box.rec.off_owner()


def test_5_the_uncovered_result_advice_runs_on_the_owner(
    owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, _ = owners
    box = _box(a, handle=lb.Owned())  # returns={'handle': loopbridge.Owned()}, as advised
    p = lb.proxy(box)
    h = lb.blocking(p).handle()
    assert lb.is_proxy(h)
    assert lb.blocking(h).read() == 1
    with lb.blocking(h) as entered:
        assert lb.is_proxy(entered)
    assert not box.rec.off_owner()


def test_6_a_pending_result_is_made_on_the_owner(
    owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = owners
    box = _box(a, open=lb.Owned())
    p = lb.proxy(box)
    pending = p.open()  # nothing has run yet
    assert box.rec.ran == []
    lb.transfer(box, b.loop)

    async def main() -> None:
        async with pending as h:
            assert lb.is_proxy(h)
            assert await h.read() == 1

    asyncio.run(main())
    assert [loop for loop, _ in box.rec.ran] == [b.loop, b.loop, b.loop]
    assert not box.rec.off_owner()


# ------------------------------------------------------------- state machine
class OffOwnerMachine(RuleBasedStateMachine):
    """Calls, streams, cancels, early closes and transfers, in any order: after
    each step nothing ran off its owner, every item put is either taken or still
    in the queue, and no task or thread is left behind."""

    def __init__(self) -> None:
        super().__init__()
        self.threads = threading.active_count()
        self.owners = [lb.LoopThread(name=f"sm-owner-{i}").start() for i in range(2)]
        self.caller = lb.LoopThread(name="sm-caller").start()
        self.box = _box(self.owners[0], open=lb.Owned())
        self.p = lb.proxy(self.box)
        self.owner = 0
        self.put = 0
        self.got: list[int] = []

    def teardown(self) -> None:
        self.caller.stop()
        for o in self.owners:
            o.stop()

    @rule(n=st.integers(1, 4))
    def call_put(self, n: int) -> None:
        for _ in range(n):
            lb.blocking(self.p).put(self.put)
            self.put += 1

    @rule(blocking=st.booleans())
    def call_get(self, blocking: bool) -> None:
        if self.box.q.qsize() == 0:
            return
        if blocking:
            self.got.append(lb.blocking(self.p).get())
        else:
            self.got.append(self.caller.run(self.p.get))

    @rule(k=st.integers(0, 3), through_thread=st.booleans())
    def stream_then_close(self, k: int, through_thread: bool) -> None:
        k = min(k, self.box.q.qsize())
        if through_thread:
            with lb.read_ahead(lb.blocking(self.p).items(k + 5), 0) as s:
                for _ in range(k):
                    self.got.append(next(s))
            return

        async def consume() -> None:
            s = lb.read_ahead(self.p.items(k + 5), 0)
            for _ in range(k):
                self.got.append(await s.__anext__())
            await s.aclose()

        self.caller.run(consume)

    @rule()
    def cancel_a_waiting_call(self) -> None:
        async def cancel() -> None:
            # The owner signals the caller's loop itself: no executor thread, so
            # the thread count below is exactly the machine's own loops.
            loop = asyncio.get_running_loop()
            started: asyncio.Future[None] = loop.create_future()
            self.box.on_wait = lambda: loop.call_soon_threadsafe(started.set_result, None)
            try:
                t = asyncio.ensure_future(self.p.wait())
                await asyncio.wait_for(started, BOUND)
            finally:
                self.box.on_wait = None
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t

        self.caller.run(cancel)

    @rule(through_thread=st.booleans())
    def enter_and_read(self, through_thread: bool) -> None:
        if through_thread:
            with lb.blocking(self.p.open()) as h:
                assert lb.blocking(h).read() == 1
            return

        async def enter() -> None:
            async with self.p.open() as h:
                assert await h.read() == 1

        self.caller.run(enter)

    @rule()
    def transfer(self) -> None:
        self.owner = 1 - self.owner
        lb.transfer(self.box, self.owners[self.owner].loop)

    @invariant()
    def nothing_off_owner(self) -> None:
        assert not self.box.rec.off_owner()

    @invariant()
    def nothing_lost(self) -> None:
        left = self.box.q.qsize()
        assert len(self.got) + left == self.put
        assert sorted(self.got) == list(range(len(self.got)))  # FIFO: taken in order

    @invariant()
    def nothing_left_running(self) -> None:
        for o in self.owners:
            assert not tasks_on(o.loop)
        assert threading.active_count() <= self.threads + 3  # the 3 loops' threads


OffOwnerMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestOffOwnerMachine = OffOwnerMachine.TestCase
