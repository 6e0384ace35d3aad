"""A function called on another loop through loopbridge's crossing (loopbridge_adapters.on_loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import loopbridge as lb
from loopbridge_adapters.on_loop import arun_on, run_on

BOUND_S = 30.0  # an upper bound only: every wait ends on an event well before it


@pytest.fixture
def target() -> Iterator[lb.LoopThread]:
    with lb.LoopThread("target") as thread:
        yield thread


def _where() -> str:
    return threading.current_thread().name


async def _where_async() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


def test_run_on_calls_sync_and_async_functions_on_the_loop(target: lb.LoopThread) -> None:
    assert run_on(target.loop, _where) == "target"
    assert run_on(target.loop, _where_async) == "target"
    started = run_on(target.loop, asyncio.get_running_loop)
    assert started is target.loop


def test_arun_on_leaves_the_calling_loop_running(target: lb.LoopThread) -> None:
    async def caller() -> list[str]:
        ticked = asyncio.Event()
        asyncio.get_running_loop().call_soon(ticked.set)
        got = [await arun_on(target.loop, _where), await arun_on(target.loop, _where_async)]
        assert ticked.is_set()
        return got

    assert asyncio.run(caller()) == ["target", "target"]


def test_on_the_loop_itself_it_is_refused(target: lb.LoopThread) -> None:
    async def nested() -> None:
        run_on(asyncio.get_running_loop(), _where)

    with pytest.raises(lb.LoopAffinityError):
        target.run(nested)


def test_a_blocked_loop_times_the_call_out_and_never_runs_it(target: lb.LoopThread) -> None:
    hold, held, ran = threading.Event(), threading.Event(), threading.Event()

    def block() -> None:
        held.set()
        hold.wait(BOUND_S)

    target.loop.call_soon_threadsafe(block)
    assert held.wait(BOUND_S)
    try:
        with pytest.raises(TimeoutError):
            run_on(target.loop, ran.set, timeout=0.1)
    finally:
        hold.set()
    assert target.run(asyncio.sleep, 0) is None  # the loop has run since
    assert not ran.is_set()  # taken back: it never started


def test_a_closed_loop_fails_the_call() -> None:
    thread = lb.LoopThread("gone").start()
    loop = thread.loop
    thread.stop()
    with pytest.raises(lb.OwnerLoopClosed):
        run_on(loop, _where)
