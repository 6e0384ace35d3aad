"""EngineLoop: an engine built on a loop of its own, reached from a busy actor loop."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading

import pytest

import loopbridge as lb
from loopbridge_adapters.engine_loop import EngineLoop, engine_loop_factory


@lb.loop_affine
class _Engine:
    """Starts a task on the loop it is built on, as vLLM's AsyncLLM starts its output handler."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = threading.current_thread()
        self.background = self.loop.create_task(asyncio.Event().wait())

    async def where(self) -> str:
        return threading.current_thread().name


def test_build_runs_the_factory_on_the_engine_loop_which_owns_the_engine() -> None:
    with EngineLoop("engine-loop-test") as engine_loop:
        engine = engine_loop.build(_Engine)
        assert engine.thread.name == "engine-loop-test"
        assert engine.loop is engine_loop.loop
        assert lb.owner_loop(engine) is engine_loop.loop
        assert engine.background.get_loop() is engine_loop.loop
        assert asyncio.run(lb.proxy(engine).where()) == "engine-loop-test"


def test_build_awaits_an_async_factory() -> None:
    async def make() -> _Engine:
        return _Engine()

    with EngineLoop() as engine_loop:
        assert engine_loop.build(make).loop is engine_loop.loop


def test_abuild_and_arun_leave_the_calling_loop_running() -> None:
    """The actor's loop keeps running its own work while the engine is built."""
    release = threading.Event()
    ticks: list[int] = []

    def slow_factory() -> _Engine:
        # Released by the actor loop's own work, which runs meanwhile: an abuild
        # that blocked the actor's loop would never get here.
        assert release.wait(10), "the calling loop did not run while the engine was built"
        return _Engine()

    async def actor() -> str:
        async def work() -> None:
            ticks.append(1)
            release.set()

        work_task = asyncio.get_running_loop().create_task(work())
        engine = await engine_loop.abuild(slow_factory)
        await work_task
        return await engine_loop.arun(engine.where)

    with EngineLoop("engine-loop-test") as engine_loop:
        assert asyncio.run(actor()) == "engine-loop-test"
    assert ticks == [1]


def test_arun_on_the_engine_loop_itself_is_refused() -> None:
    async def noop() -> None:
        pass

    async def nested() -> None:
        await engine_loop.arun(noop)

    with (
        EngineLoop() as engine_loop,
        pytest.raises(lb.LoopAffinityError, match="await the call directly"),
    ):
        engine_loop.build(nested)


def test_stop_cancels_what_is_left_and_ends_the_thread() -> None:
    engine_loop = EngineLoop().start()
    engine = engine_loop.build(_Engine)
    assert engine_loop.running
    engine_loop.stop()
    assert not engine_loop.running
    assert engine.background.cancelled()
    assert not engine.thread.is_alive()


def test_the_loop_is_uvloop_when_installed_unless_asyncio_is_asked_for() -> None:
    installed = importlib.util.find_spec("uvloop") is not None
    with EngineLoop("engine-loop-default") as default, EngineLoop(use_uvloop=False) as plain:
        assert default.kind == ("uvloop" if installed else "asyncio")
        assert plain.kind == "asyncio" and isinstance(plain.loop, asyncio.BaseEventLoop)
        if installed:
            import uvloop

            assert isinstance(default.loop, uvloop.Loop)


def test_uvloop_asked_for_but_missing_fails_before_a_thread_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop: ImportError
    threads = threading.active_count()
    with pytest.raises(ImportError, match=r"pip install uvloop, or choose asyncio's loop"):
        EngineLoop(use_uvloop=True)
    assert engine_loop_factory(None) is asyncio.new_event_loop  # the default falls back
    assert threading.active_count() == threads
