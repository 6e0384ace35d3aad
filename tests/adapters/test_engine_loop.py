"""The deprecated EngineLoop (loopbridge_adapters.engine_loop): a LoopThread that warns.

What it did is :class:`loopbridge.LoopThread`'s now (tests/core/test_loop_thread.py);
here only that code written against it still runs: ``build``/``abuild`` are
``run``/``arun``, ``kind`` names the loop, and making one warns, naming the
replacement.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading

import pytest

import loopbridge as lb
from loopbridge_adapters.engine_loop import EngineLoop


@lb.loop_affine
class _Engine:
    def __init__(self) -> None:
        self.thread = threading.current_thread()

    async def where(self) -> str:
        return threading.current_thread().name


def test_engine_loop_warns_and_is_a_loop_thread_with_its_old_names() -> None:
    with pytest.warns(DeprecationWarning, match=r"use loopbridge\.LoopThread"):
        engine_loop = EngineLoop()
    assert isinstance(engine_loop, lb.LoopThread) and engine_loop.name == "engine-loop"
    with engine_loop:
        engine = engine_loop.build(_Engine)
        assert engine.thread is engine_loop.thread

        async def actor() -> str:
            built = await engine_loop.abuild(_Engine)
            return await engine_loop.arun(built.where)

        assert asyncio.run(actor()) == "engine-loop"
        installed = importlib.util.find_spec("uvloop") is not None
        assert engine_loop.kind == ("uvloop" if installed else "asyncio")
    assert not engine_loop.running
    with pytest.warns(DeprecationWarning), EngineLoop(use_uvloop=False) as plain:
        assert plain.kind == "asyncio"
