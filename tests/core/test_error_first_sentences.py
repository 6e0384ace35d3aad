"""Each error a user meets names their member, loop or ``LoopThread``, and the fix,
in its first sentence (issue 53, item 6).

One test per message pins that first sentence: the proxy member called from a
plain thread and never awaited (Python's own warning), the same coroutine driven
with no loop running, an object made inside ``trio.run``, a call whose owner
``LoopThread`` stopped (in flight, and made afterwards), and a cycle of blocking
calls through three loops.
"""

from __future__ import annotations

import asyncio
import gc
import re
import threading
import warnings
from typing import Any

import pytest

import loopbridge as lb

from .conftest import until_set


def first_sentence(message: str) -> str:
    """Up to the first full stop that ends a sentence (``loopbridge.blocking`` has none)."""
    return re.split(r"\.(?:\s|$)", message, maxsplit=1)[0]


@lb.loop_affine
class Engine:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.release: asyncio.Event | None = None

    async def generate(self, prompt: str) -> str:
        return prompt

    async def hold(self) -> None:
        self.release = asyncio.Event()
        self.started.set()
        await self.release.wait()


async def _make_engine() -> Engine:
    return Engine()


def test_a_never_awaited_call_is_named_after_the_member(owner: lb.LoopThread) -> None:
    """Called from a plain thread without blocking(), the coroutine is the member's:
    Python's warning names Engine.generate, not loopbridge's internals."""
    p = lb.proxy(owner.run(_make_engine))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        coro: Any = p.generate("x")
        assert "Engine.generate" in repr(coro)
        del coro
        gc.collect()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert "coroutine 'Engine.generate' was never awaited" in messages, messages


def test_driving_it_with_no_loop_says_use_blocking(owner: lb.LoopThread) -> None:
    p = lb.proxy(owner.run(_make_engine))
    coro: Any = p.generate("x")
    with pytest.raises(lb.LoopAffinityError) as info:
        coro.send(None)
    first = first_sentence(str(info.value))
    assert first.startswith("Engine.generate() was awaited through a proxy with no event loop"), (
        first
    )
    assert "loopbridge.blocking(p).generate(...)" in first, first


def test_an_object_made_inside_trio_is_told_so(owner: lb.LoopThread) -> None:
    trio = pytest.importorskip("trio")
    errors: list[BaseException] = []

    async def main() -> None:
        engine = Engine()  # no asyncio loop runs in a trio run
        try:
            await lb.proxy(engine).generate("x")
        except lb.LoopAffinityError as exc:
            errors.append(exc)

    trio.run(main)
    first = first_sentence(str(errors[0]))
    assert first.startswith("Engine object has no owner loop: it was created inside a trio run")
    assert "create it on one" in first and "LoopThread" in first, first
    assert "loopbridge.transfer(obj, loop)" in first, first


def test_a_call_in_flight_when_its_loop_thread_stops_names_both() -> None:
    owner = lb.LoopThread(name="engine-owner", use_uvloop=False)  # the message names its kind
    owner.start()
    engine = owner.run(_make_engine)
    p = lb.proxy(engine)

    async def caller() -> BaseException:
        task = asyncio.ensure_future(p.hold())
        await until_set(engine.started)
        await asyncio.to_thread(owner.stop)
        try:
            await task
        except BaseException as exc:
            return exc
        raise AssertionError("the call outlived its owner loop")

    exc = asyncio.run(caller())
    assert isinstance(exc, lb.OwnerLoopClosed)
    first = first_sentence(str(exc))
    assert first.startswith(
        "Engine.hold() cannot complete: LoopThread 'engine-owner', asyncio loop 0x"
    ), first
    assert "loopbridge.transfer(obj, loop)" in first, first


def test_a_call_made_after_its_loop_thread_stopped_names_both() -> None:
    owner = lb.LoopThread(name="engine-owner", use_uvloop=False)  # the message names its kind
    owner.start()
    p = lb.proxy(owner.run(_make_engine))
    owner.stop()
    with pytest.raises(lb.OwnerLoopClosed) as info:
        lb.blocking(p).generate("x")
    first = first_sentence(str(info.value))
    assert first.startswith("Engine.generate() cannot start:"), first
    assert "LoopThread 'engine-owner', asyncio loop 0x" in first, first
    assert "loopbridge.transfer(obj, loop)" in first, first

    async def elsewhere() -> None:
        await p.generate("x")

    with pytest.raises(
        lb.OwnerLoopClosed, match=r"^Engine\.generate\(\) cannot start: .*LoopThread"
    ):
        asyncio.run(elsewhere())


@lb.loop_affine
class Hop:
    """One loop's part of a cycle: ``go`` waits, blocking its loop's thread, for the next."""

    def __init__(self) -> None:
        self.next: Any = None
        self.back: Any = None

    async def go(self) -> object:
        if self.next is not None:
            return lb.blocking(self.next).go()  # blocks this loop's thread
        return await self.back.ping()  # the last hop: an async call to the first loop

    async def ping(self) -> str:
        return "pong"


def test_a_blocking_cycle_names_every_loop_in_it() -> None:
    """A's thread blocks on B, B's on C, and C's work calls A: A -> B -> C -> A,
    where the refusal named only A and B."""
    threads = [lb.LoopThread(name=n) for n in ("loop-a", "loop-b", "loop-c")]
    for t in threads:
        t.start()
    try:

        async def make() -> Hop:
            return Hop()

        a, b, c = (lb.proxy(t.run(make)) for t in threads)
        lb.unwrap(a).next, lb.unwrap(b).next, lb.unwrap(c).back = b, c, a
        with pytest.raises(lb.LoopAffinityError) as info:
            lb.blocking(a).go()
    finally:
        for t in threads:
            t.stop()
    first = first_sentence(str(info.value))
    assert "would wait for ever" in first, first
    assert "await the proxy instead" in first, first
    cycle = re.search(r"a cycle \((.*?)\): ", first)
    assert cycle is not None, first
    hops = re.findall(r"LoopThread '(loop-\w)'", cycle.group(1))
    assert hops == ["loop-a", "loop-b", "loop-c", "loop-a"], first
