"""An owner loop on a dedicated thread (:mod:`loopbridge._loop_thread`): it runs
functions on its loop (``run`` from a thread, ``arun`` from another loop), its loop is
uvloop when installed unless asked otherwise, and its ``stop()`` fails the calls and
streams still waiting on that loop with ``OwnerLoopClosed``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading

import pytest

import loopbridge as lb

from .conftest import make_engine as _make
from .conftest import until_set


def test_loop_thread_run_and_errors() -> None:
    t = lb.LoopThread(name="runner")
    with pytest.raises(lb.LoopAffinityError):
        _ = t.loop  # not started yet
    with t:

        async def add(a: int, b: int) -> int:
            return a + b

        async def runs_on() -> threading.Thread:
            return threading.current_thread()

        assert t.run(add, 2, 3) == 5
        assert t.running
        assert t.run(runs_on) is t.thread is not threading.current_thread()
    assert not t.running
    with pytest.raises(lb.OwnerLoopClosed):
        t.run(add, 1, 1)


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_loop_thread_stop_fails_pending_calls_and_streams(kind: str) -> None:
    owner = lb.LoopThread(use_uvloop=kind == "uvloop").start()
    engine = owner.run(_make)
    p = lb.proxy(engine)

    async def main() -> None:
        call = asyncio.create_task(p.sleep(30))
        stream = p.count(10**9, delay=30)

        async def consume() -> None:
            async for _ in stream:
                pass

        consumer = asyncio.create_task(consume())
        await until_set(engine.started["sleep"])
        await until_set(engine.started["count"])
        stopper = threading.Thread(target=owner.stop)
        stopper.start()
        # Both fail long before the owner side would have finished (30 s).
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(call, 25)
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(consumer, 25)
        with pytest.raises(lb.OwnerLoopClosed):
            await p.echo(1)  # new calls fail too
        stopper.join()

    asyncio.run(main())


@lb.loop_affine
class _Engine:
    """Starts a task on the loop it is built on, as vLLM's AsyncLLM starts its output handler."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = threading.current_thread()
        self.background = self.loop.create_task(asyncio.Event().wait())

    async def where(self) -> str:
        return threading.current_thread().name


def test_run_calls_a_sync_factory_on_the_loop_which_owns_what_it_makes() -> None:
    with lb.LoopThread("engine-loop") as t:
        engine = t.run(_Engine)
        assert engine.thread is t.thread and engine.loop is t.loop
        assert lb.owner_loop(engine) is t.loop
        assert engine.background.get_loop() is t.loop
        assert asyncio.run(lb.proxy(engine).where()) == "engine-loop"
    assert engine.background.cancelled()  # stop() swept what was left on the loop


def test_arun_leaves_the_calling_loop_running() -> None:
    """The calling loop runs its own work while the factory runs on the thread's loop."""
    release = threading.Event()
    ticks: list[int] = []

    def slow_factory() -> _Engine:
        # Released by the calling loop's own work, which runs meanwhile: an arun that
        # blocked the calling loop would never get here.
        assert release.wait(10), "the calling loop did not run while the factory ran"
        return _Engine()

    async def caller() -> str:
        async def work() -> None:
            ticks.append(1)
            release.set()

        work_task = asyncio.get_running_loop().create_task(work())
        engine = await t.arun(slow_factory)
        await work_task
        return await t.arun(engine.where)

    with lb.LoopThread("engine-loop") as t:
        assert asyncio.run(caller()) == "engine-loop"
    assert ticks == [1]


def test_cancelling_arun_cancels_the_call_on_the_loop() -> None:
    entered, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def caller() -> None:
        call = asyncio.ensure_future(t.arun(forever))
        assert await asyncio.to_thread(entered.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    with lb.LoopThread() as t:
        asyncio.run(caller())
        assert cancelled.wait(10)


def test_arun_on_its_own_loop_and_after_stop_is_refused() -> None:
    async def nested() -> None:
        await t.arun(asyncio.sleep, 0)

    with (
        lb.LoopThread("own") as t,
        pytest.raises(lb.LoopAffinityError, match=r"'own'\.arun\(\) called on its own"),
    ):
        t.run(nested)
    with pytest.raises(lb.OwnerLoopClosed, match="'own' has stopped"):
        asyncio.run(t.arun(asyncio.sleep, 0))


def test_the_loop_is_uvloop_when_installed_unless_asyncio_is_asked_for() -> None:
    installed = importlib.util.find_spec("uvloop") is not None
    with lb.LoopThread("default") as default, lb.LoopThread(use_uvloop=False) as plain:
        assert type(plain.loop).__module__.startswith("asyncio")
        assert type(default.loop).__module__.startswith("uvloop" if installed else "asyncio")
    if installed:
        with lb.LoopThread(use_uvloop=True) as asked:
            assert type(asked.loop).__module__.startswith("uvloop")


def test_uvloop_asked_for_but_missing_fails_naming_the_fix_before_a_thread_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop: ImportError
    threads = threading.active_count()
    with pytest.raises(ImportError, match=r"LoopThread 'engine' was asked to run on uvloop"):
        lb.LoopThread("engine", use_uvloop=True)
    with lb.LoopThread() as fallback:  # the default falls back to asyncio's loop
        assert type(fallback.loop).__module__.startswith("asyncio")
    assert threading.active_count() == threads
    with pytest.raises(ValueError, match="pass one"):
        lb.LoopThread(loop_factory=asyncio.new_event_loop, use_uvloop=False)
