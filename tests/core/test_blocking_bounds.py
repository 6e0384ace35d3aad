"""Blocking waits are bounded, and cycles of blocked owner threads are refused.

On 3e67832 ``blocking()`` had no timeout, and ``blocking(pA).m()`` called on
loop B's thread, while A's ``m()`` awaited something owned by B, hung for ever
with no error (the hang dump showed the cycle).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import loopbridge as lb

from .conftest import Engine, until_set


def test_a_blocking_call_gives_up_after_its_timeout(owner: lb.LoopThread, engine: Engine) -> None:
    b = lb.blocking(lb.proxy(engine), timeout=0.2)
    with pytest.raises(TimeoutError, match=r"Engine\.sleep\(\).*0\.2 s"):
        b.sleep(30)
    assert engine.log[0][0] == "cancelled"  # the owner side was cancelled and cleaned up
    assert engine.log[1][0] == "cleanup done"
    assert b.echo(3) == 3  # a face with a timeout still answers what is quick


def test_a_blocking_stream_gives_up_per_item(owner: lb.LoopThread, engine: Engine) -> None:
    items = lb.blocking(lb.proxy(engine), timeout=0.2).count(3, 30.0)
    with pytest.raises(TimeoutError, match=r"Engine\.count\(\)"):
        next(items)
    assert engine.count_finished.wait(30)  # closed on the owner


def test_timeout_values_are_checked(engine: Engine) -> None:
    with pytest.raises(ValueError, match="positive"):
        lb.blocking(lb.proxy(engine), timeout=0)
    b = lb.blocking(lb.proxy(engine))
    assert lb.blocking(b) is b
    assert lb.blocking(b, timeout=1.0) is not b  # the same proxy, with a timeout


@lb.loop_affine
class Node:
    """Two of these, on loops A and B, calling each other."""

    def __init__(self) -> None:
        self.peer: Any = None
        self.entered = threading.Event()
        self.gate = threading.Event()

    async def ask_peer(self) -> str:
        return await self.peer.answer()  # type: ignore[no-any-return]

    async def answer(self) -> str:
        return "answer"

    async def wait_at_gate(self) -> str:
        self.entered.set()
        await asyncio.to_thread(self.gate.wait, 30)
        return "through"


def _pair() -> tuple[lb.LoopThread, lb.LoopThread, Node, Node]:
    a, b = lb.LoopThread(name="loop-A").start(), lb.LoopThread(name="loop-B").start()

    async def make() -> Node:
        return Node()

    na, nb = a.run(make), b.run(make)
    na.peer, nb.peer = lb.proxy(nb), lb.proxy(na)
    return a, b, na, nb


def test_a_blocking_call_whose_work_needs_the_blocked_loop_is_refused() -> None:
    """B's thread blocks on A's ask_peer(), which awaits B's answer(): B can never run it."""
    a, b, na, _ = _pair()
    try:

        async def on_b() -> Any:
            return lb.blocking(lb.proxy(na)).ask_peer()

        with pytest.raises(lb.LoopAffinityError, match=r"cycle \(.*loop.* -> .*loop.* -> "):
            b.run(on_b)
        assert b.run(_answer_of(na)) == "answer"  # B is free again
    finally:
        a.stop()
        b.stop()


def _answer_of(node: Node) -> Any:
    async def ask() -> str:
        return await lb.proxy(node).answer()

    return ask


def test_two_loops_blocking_on_each_other_are_refused_at_once() -> None:
    """A's thread blocks on B; then B's thread would block on A: refused, not hung."""
    a, b, na, nb = _pair()
    try:

        async def a_blocks_on_b() -> Any:
            return lb.blocking(lb.proxy(nb)).wait_at_gate()

        held = asyncio.run_coroutine_threadsafe(a_blocks_on_b(), a.loop)

        async def b_blocks_on_a() -> Any:
            await until_set(nb.entered)  # A's thread is blocked now
            return lb.blocking(lb.proxy(na)).answer()

        with pytest.raises(lb.LoopAffinityError, match="cycle"):
            b.run(b_blocks_on_a)
        nb.gate.set()
        assert held.result(30) == "through"
    finally:
        a.stop()
        b.stop()
