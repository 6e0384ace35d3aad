"""Each primitive misused from a foreign thread or loop is flagged on the first
occurrence, before the operation runs, with both sides of the misuse named."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pickle
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from sanitizer_support import LoopInThread, in_thread, skip_if_installed_for_session

from loopbridge.sanitizer import SanitizerError, SanitizerWarning, sanitize

HERE = __file__.removesuffix("c")  # .py even if run from a .pyc


def _expect_flag(block: sanitize, fn: Callable[[], Any], operation: str) -> SanitizerError:
    with pytest.raises(SanitizerError) as info:
        in_thread(fn, name="intruder")
    report = info.value.report
    assert report.operation == operation
    assert report.kind == "wrong-thread"
    assert report.call_site.thread == "intruder"
    assert report.call_site.code is not None
    assert report.call_site.code.co_filename == HERE
    assert report.owner_thread == "owner-loop"
    assert block.reports == [report]
    return info.value


@pytest.fixture
def owner() -> Any:
    with LoopInThread("owner-loop") as lt:
        yield lt


def test_event_set_from_foreign_thread(owner: LoopInThread) -> None:
    with sanitize("raise") as block:
        ev: asyncio.Event = owner.call(asyncio.Event)
        waiting = owner.submit(ev.wait())  # binds the event to the owner loop
        owner.call(lambda: None)
        err = _expect_flag(block, lambda: ev.set(), "asyncio.Event.set")
        assert not ev.is_set(), "raise policy must stop the operation"
        assert err.report.bind is not None and err.report.bind.thread == "owner-loop"
        assert err.report.waiters and "owner-loop" in err.report.waiters[0]
        # both sides are in the message
        text = str(err)
        assert "intruder" in text and "owner-loop" in text and HERE in text
        owner.loop.call_soon_threadsafe(ev.set)  # the correct way
        assert waiting.result(5) is True
    assert len(block.reports) == 1


def test_future_set_result_from_foreign_thread(owner: LoopInThread) -> None:
    with sanitize("raise") as block:
        fut: asyncio.Future[int] = owner.call(lambda: owner.loop.create_future())
        err = _expect_flag(block, lambda: fut.set_result(1), "asyncio.Future.set_result")
        assert not fut.done()
        bind = err.report.bind
        assert bind is not None and bind.code is not None and bind.code.co_name == "<lambda>"
        assert bind.code.co_filename == HERE and bind.thread == "owner-loop"
        _expect_flag_again = pytest.raises(SanitizerError)
        with _expect_flag_again:
            in_thread(lambda: fut.set_exception(ValueError()))
        owner.loop.call_soon_threadsafe(fut.cancel)


def test_task_cancel_from_foreign_thread(owner: LoopInThread) -> None:
    with sanitize("raise") as block:

        async def sleeper() -> None:
            await asyncio.sleep(30)

        task: asyncio.Task[None] = owner.call(lambda: owner.loop.create_task(sleeper()))
        err = _expect_flag(block, lambda: task.cancel(), "asyncio.Task.cancel")
        assert not task.cancelled() and not task.done()
        assert err.report.bind is not None and err.report.bind.thread == "owner-loop"
        owner.loop.call_soon_threadsafe(task.cancel)


def test_the_error_survives_pickling_with_its_report(owner: LoopInThread) -> None:
    """A site's code object crosses as a stand-in with the same file and function
    name: the message and every other field of the report are unchanged."""
    with sanitize("raise") as block:
        ev: asyncio.Event = owner.call(asyncio.Event)
        waiting = owner.submit(ev.wait())
        owner.call(lambda: None)
        err = _expect_flag(block, lambda: ev.set(), "asyncio.Event.set")
        owner.loop.call_soon_threadsafe(ev.set)
        assert waiting.result(5) is True
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is SanitizerError and back.args == err.args
    assert str(back) == str(err) == back.report.message()
    sites = {"call_stack", "bind"}
    fields = [f.name for f in dataclasses.fields(err.report) if f.name not in sites]
    assert [getattr(back.report, f) for f in fields] == [getattr(err.report, f) for f in fields]
    assert [str(s) for s in back.report.call_stack] == [str(s) for s in err.report.call_stack]
    assert err.report.bind is not None and str(back.report.bind) == str(err.report.bind)
    assert back.report.call_site.code is not None
    assert back.report.call_site.code.co_filename == HERE


def test_queue_put_nowait_from_foreign_thread(owner: LoopInThread) -> None:
    with sanitize("raise") as block:
        q: asyncio.Queue[int] = owner.call(asyncio.Queue)
        getter = owner.submit(q.get())
        owner.call(lambda: None)
        err = _expect_flag(block, lambda: q.put_nowait(1), "asyncio.Queue.put_nowait")
        assert q.empty()
        assert err.report.waiters, "the parked getter is named"
        owner.loop.call_soon_threadsafe(q.put_nowait, 2)
        assert getter.result(5) == 2


def test_queue_used_before_any_waiter(owner: LoopInThread) -> None:
    """No waiter, so asyncio never bound the queue: first use binds it for us."""
    with sanitize("raise") as block:
        q: asyncio.Queue[int] = owner.call(asyncio.Queue)
        owner.call(lambda: q.put_nowait(1))
        err = _expect_flag(block, lambda: q.get_nowait(), "asyncio.Queue.get_nowait")
        assert err.report.bind_how == "first used on this loop"
        assert q.qsize() == 1


def test_condition_notify_from_foreign_thread(owner: LoopInThread) -> None:
    with sanitize("raise") as block:
        cond: asyncio.Condition = owner.call(asyncio.Condition)

        async def waiter() -> None:
            async with cond:
                await cond.wait()

        async def hold() -> None:
            await cond.acquire()

        w = owner.submit(waiter())
        owner.call(lambda: None)
        owner.run(hold())  # the owner loop holds the lock now
        _expect_flag(block, lambda: cond.notify(), "asyncio.Condition.notify")
        with pytest.raises(SanitizerError):
            in_thread(lambda: cond.notify_all())

        def notify_and_release() -> None:
            cond.notify()
            cond.release()

        owner.loop.call_soon_threadsafe(notify_and_release)
        w.result(5)


def test_lock_release_from_foreign_thread(owner: LoopInThread) -> None:
    """The lock was never contended, so asyncio never bound it to a loop; the
    sanitizer still knows its owner from the acquire."""
    with sanitize("raise") as block:
        lock: asyncio.Lock = owner.call(asyncio.Lock)
        owner.run(lock.acquire())
        assert lock._loop is None  # asyncio itself would never notice
        _expect_flag(block, lambda: lock.release(), "asyncio.Lock.release")
        assert lock.locked()
        owner.loop.call_soon_threadsafe(lock.release)


def test_semaphore_release_from_foreign_thread(owner: LoopInThread) -> None:
    with sanitize("raise") as block:
        sem: asyncio.Semaphore = owner.call(lambda: asyncio.BoundedSemaphore(1))
        owner.run(sem.acquire())
        _expect_flag(block, lambda: sem.release(), "asyncio.Semaphore.release")
        assert sem.locked()
        owner.loop.call_soon_threadsafe(sem.release)


@pytest.mark.parametrize(
    "method", ["call_soon", "call_later", "call_at", "create_task", "create_future", "stop"]
)
def test_loop_scheduling_from_foreign_thread(owner: LoopInThread, method: str) -> None:
    async def nothing() -> None:
        pass

    calls: dict[str, Callable[[], object]] = {
        "call_soon": lambda: owner.loop.call_soon(print),
        "call_later": lambda: owner.loop.call_later(10, print),
        "call_at": lambda: owner.loop.call_at(owner.loop.time() + 10, print),
        "create_task": lambda: owner.loop.create_task(coro),
        "create_future": lambda: owner.loop.create_future(),
        "stop": lambda: owner.loop.stop(),
    }
    coro = nothing()
    with sanitize("raise") as block:
        err = _expect_flag(block, calls[method], f"loop.{method}")
        assert err.report.owner_loop.endswith(f"{id(owner.loop):#x}")
    coro.close()
    assert owner.loop.is_running()


def test_waiter_woken_from_another_loop() -> None:
    """The wake-up runs on loop A, the waiter belongs to loop B (running): the
    report is made on A without raising there (A's machinery goes on), the wake
    is not done, and B's waiter fails with the error."""
    with sanitize("raise") as block, LoopInThread("loop-a") as a, LoopInThread("loop-b") as b:
        ev: asyncio.Event = b.call(asyncio.Event)
        waiting = b.submit(ev.wait())
        b.call(lambda: None)
        a.call(ev.set)  # not raised in loop A
        with pytest.raises(SanitizerError) as info:
            waiting.result(5)
        report = info.value.report
        assert report.kind == "wrong-loop"
        assert report.call_site.thread == "loop-a" and report.owner_thread == "loop-b"
        assert f"{id(a.loop):#x}" in report.call_loop
        assert report.waiters and f"{id(b.loop):#x}" in report.waiters[0]
        assert not b.call(ev.is_set)

        fut: asyncio.Future[int] = b.call(b.loop.create_future)
        a.call(lambda: fut.set_result(1))
        with pytest.raises(SanitizerError):
            b.call(lambda: fut.result())
        assert len(block.reports) == 2


def test_waiter_of_idle_loop_woken_from_running_loop() -> None:
    """Owner loop not running at all: waking its future from another loop is
    still a cross-loop wake-up."""
    idle = asyncio.new_event_loop()
    try:
        with sanitize("raise"):
            fut = idle.create_future()  # no loop running here: allowed

            async def wake() -> None:
                fut.set_result(1)

            with pytest.raises(SanitizerError) as info:
                asyncio.run(wake())
            assert info.value.report.kind == "wrong-loop"
            fut.set_result(2)  # plain code, owner idle: allowed
    finally:
        idle.close()


def test_flagged_every_time_without_the_race_firing(owner: LoopInThread) -> None:
    """Deterministic: a foreign set() on a fresh event is flagged each time, on
    the first call. Without the sanitizer the same call passes silently."""
    skip_if_installed_for_session()

    def fresh_bound_event() -> asyncio.Event:
        ev: asyncio.Event = owner.call(asyncio.Event)
        owner.submit(ev.wait())
        owner.call(lambda: None)
        return ev

    silent = fresh_bound_event()
    in_thread(silent.set)  # no sanitizer: no error at all
    owner.loop.call_soon_threadsafe(lambda: None)
    with sanitize("raise") as block:
        for _ in range(20):
            ev = fresh_bound_event()
            with pytest.raises(SanitizerError):
                in_thread(ev.set)
            owner.loop.call_soon_threadsafe(ev.set)
    assert len(block.reports) == 20


def test_warn_policy_once_per_site(owner: LoopInThread) -> None:
    with sanitize("warn") as block:
        events = [owner.call(asyncio.Event) for _ in range(3)]
        for ev in events:
            owner.call(ev.clear)  # first use binds to the owner loop

        def misuse_all() -> None:
            for ev in events:
                ev.set()  # one site, three times

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            in_thread(misuse_all)
        ours = [w for w in caught if issubclass(w.category, SanitizerWarning)]
        assert len(ours) == 1
        assert ours[0].filename == HERE
        assert all(ev.is_set() for ev in events), "warn lets the operation run"
        assert len(block.reports) == 3


def test_log_policy(owner: LoopInThread, caplog: pytest.LogCaptureFixture) -> None:
    with sanitize("log") as block:
        fut: asyncio.Future[int] = owner.call(owner.loop.create_future)
        with caplog.at_level(logging.DEBUG, logger="loopbridge.sanitizer"):
            in_thread(lambda: fut.set_result(1))
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "asyncio.Future.set_result" in errors[0].getMessage()
        assert len(block.reports) == 1, "nested checks (call_soon) are not reported twice"
        assert fut.done()


def test_report_is_recorded_even_when_swallowed(owner: LoopInThread) -> None:
    """A misuse inside a loop callback raises into the loop's exception
    handler; the block still sees it."""
    with sanitize("raise") as block, LoopInThread("other") as other:
        fut: asyncio.Future[int] = owner.call(owner.loop.create_future)
        done = threading.Event()

        def cb() -> None:
            try:
                fut.set_result(1)
            finally:
                done.set()

        other.loop.call_soon_threadsafe(cb)
        assert done.wait(5)
        assert [r.operation for r in block.reports] == ["asyncio.Future.set_result"]
        owner.loop.call_soon_threadsafe(fut.cancel)


def test_uvloop_loop_future_and_task_covered() -> None:
    """uvloop's loop is C, but uvloop.Loop is a Python subclass: its scheduling
    methods are wrapped there, and its create_future/create_task build the
    checking Future/Task."""
    uvloop = pytest.importorskip("uvloop")
    with sanitize("raise") as block, LoopInThread("owner-loop", uvloop.new_event_loop) as owner:
        assert isinstance(owner.loop, uvloop.Loop)

        async def sleeper() -> None:
            await asyncio.sleep(30)

        fut: asyncio.Future[int] = owner.call(lambda: owner.loop.create_future())
        task: asyncio.Task[None] = owner.call(lambda: owner.loop.create_task(sleeper()))
        ev: asyncio.Event = owner.call(asyncio.Event)
        owner.submit(ev.wait())
        owner.call(lambda: None)
        _expect_flag(block, lambda: owner.loop.call_soon(print), "loop.call_soon")
        block_reports = 1
        for fn, op in [
            (lambda: fut.set_result(1), "asyncio.Future.set_result"),
            (lambda: task.cancel(), "asyncio.Task.cancel"),
            (lambda: ev.set(), "asyncio.Event.set"),
        ]:
            with pytest.raises(SanitizerError) as info:
                in_thread(fn, name="intruder")
            block_reports += 1
            assert info.value.report.operation == op
            assert info.value.report.owner_thread == "owner-loop"
            assert info.value.report.bind is not None
            assert info.value.report.bind.thread == "owner-loop"
        assert len(block.reports) == block_reports
        owner.loop.call_soon_threadsafe(ev.set)
        owner.loop.call_soon_threadsafe(fut.cancel)
