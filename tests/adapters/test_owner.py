"""Declaring an engine's owner loop and member table, engine aside (loopbridge_adapters.owner).

A small class stands in for an engine whose handler starts on the loop of its first
request; the real engines' adoption is tested in tests/vllm (test_weights_real.py)
and tests/sglang (test_manager_surface.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import LoopAffinityError, LoopThread, owner_loop
from loopbridge_adapters.owner import Adoption


class _Engine:
    def __init__(self) -> None:
        self.handler_loop: asyncio.AbstractEventLoop | None = None
        self.prepared = 0

    async def generate(self) -> str:
        self.handler_loop = asyncio.get_running_loop()  # the handler starts here, for good
        return "out"

    def health(self) -> bool:
        return True


def _prepare(engine: Any) -> None:
    engine.prepared += 1


def _adoption() -> Adoption:
    return Adoption(
        noun="engine",
        handler="handler",
        moving="an engine cannot change loops once it has started",
        declarers="adopt_engine()/engine_proxy()",
        handler_loop=lambda engine: engine.handler_loop,
        declarations=lambda engine: (frozenset({"prepared"}), frozenset({"health"})),
        prepare=_prepare,
    )


@pytest.fixture
def loops() -> Iterator[tuple[LoopThread, LoopThread]]:
    first, second = LoopThread(name="owner-a").start(), LoopThread(name="owner-b").start()
    yield first, second
    first.stop()
    second.stop()


async def _adopt_here(adoption: Adoption, engine: _Engine) -> _Engine:
    return adoption.adopt(engine)


def test_adopt_declares_the_running_loop_with_the_table_once(
    loops: tuple[LoopThread, LoopThread],
) -> None:
    first, _ = loops
    adoption, engine = _adoption(), _Engine()
    assert first.run(_adopt_here, adoption, engine) is engine
    assert owner_loop(engine) is first.loop and engine.prepared == 1
    assert first.run(_adopt_here, adoption, engine) is engine  # again: a no-op
    assert engine.prepared == 1
    proxy = lb.proxy(engine)
    assert proxy.health() is True  # declared thread-safe by the table
    assert lb.blocking(engine).generate() == "out"  # runs on the owner loop
    assert engine.handler_loop is first.loop


def test_another_loop_is_refused_once_declared(loops: tuple[LoopThread, LoopThread]) -> None:
    first, second = loops
    adoption, engine = _adoption(), _Engine()
    adoption.adopt(engine, first.loop)
    with pytest.raises(
        LoopAffinityError, match=r"^the engine is already declared for another loop$"
    ):
        adoption.adopt(engine, second.loop)


def test_a_loop_other_than_the_handlers_is_refused(loops: tuple[LoopThread, LoopThread]) -> None:
    first, second = loops
    adoption, engine = _adoption(), _Engine()
    engine.handler_loop = first.loop  # started there before anyone declared it
    with pytest.raises(
        LoopAffinityError,
        match=r"^the engine.s handler already runs on another loop; an engine cannot "
        r"change loops once it has started$",
    ):
        adoption.adopt(engine, second.loop)
    assert adoption.adopt(engine) is engine  # no loop given: the handler's
    assert owner_loop(engine) is first.loop


def test_an_engine_declared_without_the_table_is_refused(
    loops: tuple[LoopThread, LoopThread],
) -> None:
    first, _ = loops
    engine = lb.adopt(_Engine(), loop=first.loop)
    with pytest.raises(LoopAffinityError, match=r"let adopt_engine\(\)/engine_proxy\(\) declare"):
        _adoption().adopt(engine)


def test_without_any_loop_the_owner_waits_for_bind_owner_loop(
    loops: tuple[LoopThread, LoopThread],
) -> None:
    first, _ = loops
    adoption, engine = _adoption(), _Engine()
    adoption.adopt(engine)  # a plain thread, no loop running
    assert owner_loop(engine) is None
    adoption.bind_owner_loop(lb.proxy(engine), first.loop)  # through a proxy too
    assert owner_loop(engine) is first.loop
    assert engine.prepared == 1


def test_bind_owner_loop_moves_an_engine_that_has_not_started(
    loops: tuple[LoopThread, LoopThread],
) -> None:
    first, second = loops
    adoption, engine = _adoption(), _Engine()
    adoption.adopt(engine, first.loop)

    async def bind_here() -> None:
        adoption.bind_owner_loop(engine, None)  # default: the running loop

    second.run(bind_here)
    assert owner_loop(engine) is second.loop


def test_bind_owner_loop_refuses_once_the_handler_runs_elsewhere(
    loops: tuple[LoopThread, LoopThread],
) -> None:
    first, second = loops
    adoption, engine = _adoption(), _Engine()
    adoption.adopt(engine, first.loop)
    lb.blocking(engine).generate()
    with pytest.raises(LoopAffinityError, match=r"^the engine.s handler already runs on another"):
        adoption.bind_owner_loop(engine, second.loop)
    assert owner_loop(engine) is first.loop


def test_bind_owner_loop_needs_a_loop() -> None:
    with pytest.raises(LoopAffinityError, match=r"bind_owner_loop\(\) needs a loop"):
        _adoption().bind_owner_loop(_Engine(), None)
