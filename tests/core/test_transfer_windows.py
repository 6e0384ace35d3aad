"""Transfers against calls: no call starts on a loop that gave the object away
before the call's first step, and work already running on the old owner keeps
the object's members until it ends.

* The window between the owner's doorway check and the owner-side task's first
  step: on Python 3.11 (and with a task factory on any version) the task starts
  one loop iteration after the check, and a ``transfer()`` that returned in
  between used to leave the call running on the old owner.  The owner is now
  checked again at the task's first step.  The window is forced with a task
  factory that holds the owner's thread right after the task is made (every
  version), and with the ``start.first_step`` interleaving point (before 3.12,
  where a stock loop starts tasks one iteration later).
* A call that transfers its own object away goes on using the object's
  members, as the method natively would; new calls go to the new owner.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import loopbridge as lb
from loopbridge._compat import gil_enabled

from .conftest import tasks_on, within
from .interleave import BOUND, Interleaving


@lb.loop_affine
class Where:
    """Records, at each member's start, the loop it runs on and whether that loop
    owned the object at that moment."""

    def __init__(self) -> None:
        self.ran: list[tuple[asyncio.AbstractEventLoop, bool]] = []

    def _started(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        self.ran.append((loop, lb.owner_loop(self) is loop))
        return loop

    async def where(self) -> asyncio.AbstractEventLoop:
        loop = self._started()
        await asyncio.sleep(0)
        return loop

    async def items(self, n: int) -> AsyncIterator[int]:
        self._started()
        for i in range(n):
            yield i

    def off_owner(self) -> int:
        return sum(1 for _, owned in self.ran if not owned)


@pytest.fixture
def two_owners() -> Iterator[tuple[lb.LoopThread, lb.LoopThread]]:
    # asyncio's loops: the movers read the loop's thread id, which uvloop does not keep.
    a = lb.LoopThread(name="old-owner", use_uvloop=False).start()
    b = lb.LoopThread(name="new-owner", use_uvloop=False).start()
    yield a, b
    a.stop()
    b.stop()


def _make_on(owner: lb.LoopThread) -> Where:
    async def make() -> Where:
        return Where()

    return owner.run(make)


class _HoldingFactory:
    """A task factory that, once armed, holds the owner's thread right after it
    made the next task (before that task's first step) until released."""

    def __init__(self) -> None:
        self.armed = False
        self.made = threading.Event()
        self.go = threading.Event()

    def __call__(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        if self.armed:
            self.armed = False
            self.made.set()
            assert self.go.wait(BOUND), "never released"
        return task


def _run_in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, name="caller")
    t.start()
    return t, out


@pytest.mark.parametrize("face", ["call", "stream", "loop caller"])
def test_transfer_between_the_check_and_the_first_step_moves_the_call(
    two_owners: tuple[lb.LoopThread, lb.LoopThread], face: str
) -> None:
    a, b = two_owners
    obj = _make_on(a)
    p = lb.proxy(obj)
    factory = _HoldingFactory()
    a.loop.call_soon_threadsafe(a.loop.set_task_factory, factory)
    assert lb.blocking(p).where() is a.loop  # the factory is set; a's port and its keeper too
    obj.ran.clear()
    factory.armed = True

    def call() -> Any:
        if face == "call":
            return lb.blocking(p).where()
        if face == "stream":
            with lb.blocking(p).items(3) as s:
                return list(s)

        async def main() -> Any:
            return await within(p.where(), 30)

        return asyncio.run(main())

    t, out = _run_in_thread(call)
    assert factory.made.wait(BOUND), "the owner never made the call's task"
    lb.transfer(obj, b.loop)  # returns while the task has not taken its first step
    factory.go.set()
    t.join(BOUND)
    assert not t.is_alive()
    assert not isinstance(out[0], BaseException), out[0]
    assert obj.ran == [(b.loop, True)], "the call started on the loop that gave the object away"
    if face != "stream":
        assert out == [b.loop]
    a.loop.call_soon_threadsafe(a.loop.set_task_factory, None)
    assert not tasks_on(a.loop) and not tasks_on(b.loop)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="a stock loop starts tasks eagerly")
def test_transfer_before_the_first_step_on_a_stock_loop(
    two_owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = two_owners
    obj = _make_on(a)
    p = lb.proxy(obj)
    with Interleaving() as il:
        il.hold("start.first_step")
        t, out = _run_in_thread(lambda: lb.blocking(p).where())
        il.reached("start.first_step")  # on a's thread, the task's first step
        lb.transfer(obj, b.loop)
        il.release("start.first_step")
        t.join(BOUND)
    assert out == [b.loop]
    assert obj.ran == [(b.loop, True)]


LOOPS = 4
THREADS = 4
TRANSFERS = 40
CALLS_BETWEEN = 25  # calls started between two transfers


@pytest.mark.skipif(
    not gil_enabled(),
    reason="measures at the member's first statement, which only the GIL (a long switch "
    "interval) runs as one step with the owner check; the named points above pin each window",
)
def test_no_call_starts_off_owner_under_load() -> None:
    """4 owner loops, callers on 4 loops and 4 threads, 40 transfers among the
    owners while they call and stream: no call ever starts on a loop that did
    not own the object at that moment.

    The switch interval is raised so that a thread gives up the GIL only when it
    blocks: the owner check and the member's own first statement then run as
    one step, and a count means the call started after the transfer returned.
    """
    owners = [lb.LoopThread(name=f"owner-{i}").start() for i in range(LOOPS)]
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.5)
    stop = threading.Event()
    errors: list[BaseException] = []
    progress = threading.Condition()
    try:
        obj = _make_on(owners[0])
        p = lb.proxy(obj, stream_window=4)

        def tick() -> None:
            with progress:
                progress.notify_all()

        def thread_caller() -> None:
            try:
                b = lb.blocking(p)
                while not stop.is_set():
                    b.where()
                    with b.items(2) as s:
                        assert list(s) == [0, 1]
                    tick()
            except BaseException as exc:
                errors.append(exc)

        def loop_caller() -> None:
            async def main() -> None:
                while not stop.is_set():
                    await within(asyncio.gather(*(p.where() for _ in range(4))), 30)
                    assert [x async for x in p.items(3)] == [0, 1, 2]
                    tick()

            try:
                asyncio.run(main())
            except BaseException as exc:
                errors.append(exc)

        callers = [threading.Thread(target=thread_caller) for _ in range(THREADS)]
        callers += [threading.Thread(target=loop_caller) for _ in range(LOOPS)]
        for t in callers:
            t.start()
        for n in range(TRANSFERS):
            seen = len(obj.ran)
            with progress:
                assert progress.wait_for(
                    lambda s=seen: len(obj.ran) >= s + CALLS_BETWEEN or errors, BOUND
                )
            lb.transfer(obj, owners[(n + 1) % LOOPS].loop)
        stop.set()
        for t in callers:
            t.join(BOUND)
        assert not any(t.is_alive() for t in callers)
        assert not errors, errors[:3]
        assert len(obj.ran) >= TRANSFERS * CALLS_BETWEEN
        assert obj.off_owner() == 0, f"{obj.off_owner()} calls started off their owner"
        for o in owners:
            assert not tasks_on(o.loop)
    finally:
        stop.set()
        sys.setswitchinterval(old_interval)
        for o in owners:
            o.stop()


# ------------------------------------------------- a running call keeps its object
@lb.loop_affine
class Mover:
    def __init__(self) -> None:
        self.release: asyncio.Event | None = None
        self.started = threading.Event()

    async def handoff(self, to: asyncio.AbstractEventLoop) -> str:
        lb.transfer(self, to)
        await asyncio.sleep(0)
        return await self.after()

    async def after(self) -> str:
        await asyncio.sleep(0)
        return f"went on at {asyncio.get_running_loop()._thread_id}"  # type: ignore[attr-defined]

    async def long(self) -> str:
        self.release = asyncio.Event()
        self.started.set()
        await self.release.wait()
        return await self.after()

    async def ticks(self, n: int) -> AsyncIterator[str]:
        for _ in range(n):
            yield await self.after()
            self.started.set()
            if self.release is None:
                self.release = asyncio.Event()
            await self.release.wait()


def _here(owner: lb.LoopThread) -> str:
    return f"went on at {owner.loop._thread_id}"  # type: ignore[attr-defined]


def test_a_call_that_transfers_its_object_goes_on(
    two_owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = two_owners

    async def make() -> Mover:
        return Mover()

    obj = a.run(make)
    p = lb.proxy(obj)
    # The call began on a, which owned the object: it goes on there to its end.
    assert asyncio.run(p.handoff(b.loop)) == _here(a)
    assert lb.owner_loop(obj) is b.loop
    assert lb.blocking(p).after() == _here(b)  # a new call goes to the new owner
    # Called directly on its owner (no proxy), likewise.
    assert b.run(obj.handoff, a.loop) == _here(b)
    assert lb.owner_loop(obj) is a.loop

    async def direct() -> str:
        return await obj.after()

    # The kept work has ended: a new task on b is refused.
    with pytest.raises(lb.LoopAffinityError, match=r"Mover\.after\(\) called from"):
        b.run(direct)


def test_calls_running_on_the_old_owner_keep_the_object_until_they_end(
    two_owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = two_owners

    async def make() -> Mover:
        return Mover()

    obj = a.run(make)
    p = lb.proxy(obj)
    t, out = _run_in_thread(lambda: lb.blocking(p).long())
    assert obj.started.wait(BOUND)
    lb.transfer(obj, b.loop)  # from a third thread, while long() waits on a
    assert lb.blocking(p).after() == _here(b)
    release = obj.release
    assert release is not None
    a.loop.call_soon_threadsafe(release.set)
    t.join(BOUND)
    assert out == [_here(a)]


def test_a_stream_running_on_the_old_owner_keeps_the_object(
    two_owners: tuple[lb.LoopThread, lb.LoopThread],
) -> None:
    a, b = two_owners

    async def make() -> Mover:
        return Mover()

    obj = a.run(make)
    p = lb.proxy(obj, stream_window=1)
    with lb.blocking(p).ticks(2) as s:
        assert next(s) == _here(a)
        assert obj.started.wait(BOUND)
        lb.transfer(obj, b.loop)
        release = obj.release
        assert release is not None
        a.loop.call_soon_threadsafe(release.set)
        assert next(s) == _here(a)  # the stream's owner side goes on where it began
        a.loop.call_soon_threadsafe(release.set)
        assert list(s) == []
    assert lb.blocking(p).after() == _here(b)
