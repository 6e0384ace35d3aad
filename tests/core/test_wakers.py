"""How a caller waits (:mod:`loopbridge._wakers`): a parked caller notices that its
owner loop died, and fails with ``OwnerLoopClosed`` instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import loopbridge as lb
from loopbridge import _ports

from .conftest import make_engine as _make
from .interleave import BOUND, wait_until_waiting


def test_blocking_caller_sees_owner_death() -> None:
    owner = lb.LoopThread().start()
    engine = owner.run(_make)
    b = lb.blocking(engine)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            b.sleep(30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    assert engine.started["sleep"].wait(30)
    owner.stop()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], lb.OwnerLoopClosed)


@lb.loop_affine
class Gate:
    """Holds every call open until its loop is gone."""

    def __init__(self) -> None:
        self.held = 0

    async def hold(self, n: int, all_in: threading.Event) -> None:
        self.held += 1
        if self.held == n:
            all_in.set()
        await asyncio.get_running_loop().create_future()  # never resolved


def test_parked_threads_are_watched_by_one_thread_and_still_see_the_owner_die(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight threads parked in blocking calls do not each wake to check the owner
    loop: the process's one liveness watcher does (it used to be 20 wake-ups a
    second per parked thread, each taking the GIL from the loop they wait for).
    A loop stopped without a shutdown sweep, its thread gone, still fails every
    parked call with ``OwnerLoopClosed``: nothing but the checks can tell them."""
    n = 8
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="user-loop")
    thread.start()

    async def make() -> Gate:
        return Gate()

    gate = lb.proxy(asyncio.run_coroutine_threadsafe(make(), loop).result(BOUND))
    all_in = threading.Event()
    checked_by: list[str] = []
    watched = threading.Event()
    check_alive = _ports.Port.check_alive

    def spy(port: _ports.Port) -> bool:
        if all_in.is_set():  # every call is parked: only waits check now
            checked_by.append(threading.current_thread().name)
            if len(checked_by) >= 3:
                watched.set()
        return check_alive(port)

    monkeypatch.setattr(_ports.Port, "check_alive", spy)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            lb.blocking(gate).hold(n, all_in)
        except BaseException as exc:
            errors.append(exc)

    callers = [threading.Thread(target=caller, name=f"caller-{i}") for i in range(n)]
    for t in callers:
        t.start()
    try:
        assert all_in.wait(BOUND) and watched.wait(BOUND)
        assert set(checked_by) == {"loopbridge-liveness"}, checked_by
    finally:
        loop.call_soon_threadsafe(loop.stop)  # no sweep: the calls' tasks stay pending
        thread.join(BOUND)
        for t in callers:
            t.join(BOUND)
    assert not any(t.is_alive() for t in callers)
    assert len(errors) == n and all(isinstance(e, lb.OwnerLoopClosed) for e in errors), errors
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


@lb.loop_affine
class Latch:
    """A call that returns once the latch is opened on its owner loop."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    async def wait(self) -> str:
        await self.opened.wait()
        return "opened"


def test_a_timeout_longer_than_a_lock_wait_can_take_is_a_timeout_all_the_same() -> None:
    """A blocking face's timeout past ``threading.TIMEOUT_MAX`` waits like any other
    (a lock wait given it raises ``OverflowError``)."""

    async def make() -> Latch:
        return Latch()

    with lb.LoopThread(name="long-timeout") as owner:
        latch = owner.run(make)
        face = lb.blocking(lb.proxy(latch), timeout=threading.TIMEOUT_MAX * 10)
        got: list[object] = []

        def caller() -> None:
            try:
                got.append(face.wait())
            except BaseException as exc:
                got.append(exc)

        t = threading.Thread(target=caller, name="long-timeout caller")
        t.start()
        wait_until_waiting(t)  # parked: the owner has not answered
        owner.run(latch.opened.set)
        t.join(BOUND)
        assert got == ["opened"]
