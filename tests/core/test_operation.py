"""What a call and a stream share (:mod:`loopbridge._operation`): starting on the
owner, where a start that fails fails the operation instead of leaving its caller
waiting; and the refusal of a blocking wait that closes a cycle of blocked owner
threads.

On 3e67832 ``blocking(pA).m()`` called on loop B's thread, while A's ``m()``
awaited something owned by B, hung for ever with no error (the hang dump showed
the cycle).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import _streams

from .conftest import Engine, Service, tasks_on, until_set


def test_an_owner_side_start_that_raises_fails_the_call(asyncio_owner: lb.LoopThread) -> None:
    """A task factory that raises on the owner: the caller gets its error, not a hang."""

    class Service:
        async def ping(self) -> str:
            return "pong"

    async def make() -> Service:
        return lb.adopt(Service())

    p = lb.proxy(asyncio_owner.run(make))

    def broken_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        coro.close()
        raise RuntimeError("task factory broken")

    async def install(factory: Any) -> None:
        asyncio.get_running_loop().set_task_factory(factory)

    asyncio_owner.run(install, broken_factory)
    try:

        async def main() -> None:
            with pytest.raises(RuntimeError, match="task factory broken"):
                await asyncio.wait_for(p.ping(), 30)  # a hang guard: fails in ms
            with pytest.raises(RuntimeError, match="task factory broken"):
                await asyncio.wait_for(p.ping(), 30)  # the port still serves

        asyncio.run(main())
        with pytest.raises(RuntimeError, match="task factory broken"):
            lb.blocking(p).ping()
    finally:
        # Not through run(): that makes its task with the factory.  Callbacks
        # run in order, so whatever comes next on this loop sees no factory.
        asyncio_owner.loop.call_soon_threadsafe(asyncio_owner.loop.set_task_factory, None)


# ------------------------------------------------- cycles of blocked owner threads
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


# ---------------------------------------------------- blocking streams' waits
# A blocking stream's next() on loop B's thread blocks B too: its waits (the first
# item, and each later one that has to wait) are checked like calls.


@lb.loop_affine
class Source:
    """On loop A: generators whose items need the peer's loop (B)."""

    def __init__(self) -> None:
        self.peer: Any = None
        self.closed = threading.Event()  # a generator's finally has run, on A
        self.taken = threading.Event()  # the consumer has the first item
        self.submitted = threading.Event()  # the call to the peer is in flight

    async def first_needs_peer(self) -> AsyncIterator[str]:
        try:
            yield await self.peer.answer()
        finally:
            self.closed.set()

    async def later_needs_peer(self) -> AsyncIterator[str]:
        try:
            yield "first"
            await until_set(self.taken)  # the consumer's first wait is over
            asked = asyncio.ensure_future(self.peer.answer())
            await asyncio.sleep(0)  # the task's first step submits the call to B
            self.submitted.set()
            yield await asked
        finally:
            self.closed.set()


def _source_pair() -> tuple[lb.LoopThread, lb.LoopThread, Source, Node]:
    a, b = lb.LoopThread(name="loop-A").start(), lb.LoopThread(name="loop-B").start()

    async def make_source() -> Source:
        return Source()

    async def make_node() -> Node:
        return Node()

    src, nb = a.run(make_source), b.run(make_node)
    src.peer = lb.proxy(nb)
    return a, b, src, nb


def _names_both_loops(exc: BaseException, a: lb.LoopThread, b: lb.LoopThread) -> None:
    text = str(exc)
    assert "cycle (" in text
    assert f"loop 0x{id(a.loop):x}" in text and f"loop 0x{id(b.loop):x}" in text, text


def _next_refused(items: Any) -> tuple[lb.LoopAffinityError, float]:
    """``next(items)`` on a blocking stream, which must be refused: the error and how
    long the refusal took (seconds)."""
    t0 = time.perf_counter()
    try:
        next(items)
    except lb.LoopAffinityError as exc:
        return exc, time.perf_counter() - t0
    raise AssertionError("not refused")


def test_a_blocking_streams_first_item_that_needs_the_blocked_loop_is_refused() -> None:
    """B's thread waits for A's first item, which awaits B's answer(): refused at once,
    not after the face's timeout (on 3e67832 and before this check: TimeoutError)."""
    a, b, src, nb = _source_pair()
    try:

        async def on_b() -> Any:
            items = lb.blocking(lb.proxy(src), timeout=20).first_needs_peer()
            return _next_refused(items)

        exc, elapsed = b.run(on_b)
        _names_both_loops(exc, a, b)
        assert elapsed < 10, elapsed  # at once: nowhere near the 20 s timeout
        assert b.run(_answer_of(nb)) == "answer"  # B is free again

        async def closed_on_a() -> None:
            await until_set(src.closed)

        b.run(closed_on_a)  # the generator ended on its owner
        assert not tasks_on(a.loop) and not tasks_on(b.loop)
    finally:
        a.stop()
        b.stop()


def test_a_blocking_streams_later_wait_whose_item_needs_the_blocked_loop_is_refused() -> None:
    """After the first item, A's generator asks B (the call is in flight, queued on B)
    and B's thread waits for the second item: refused at once, and the stream is
    closed on its owner once B runs again."""
    a, b, src, nb = _source_pair()
    try:

        async def on_b() -> Any:
            items = lb.blocking(lb.proxy(src), timeout=20).later_needs_peer()
            assert next(items) == "first"
            src.taken.set()
            assert src.submitted.wait(30)  # B's thread is not blocked: the call got in
            return _next_refused(items)

        exc, elapsed = b.run(on_b)
        _names_both_loops(exc, a, b)
        assert "later_needs_peer(), waiting for Node.answer()" in str(exc)  # found at the wait
        assert elapsed < 10, elapsed

        async def closed_on_a() -> None:
            await until_set(src.closed)

        b.run(closed_on_a)  # cancelled on its owner once B could run the call
        assert b.run(_answer_of(nb)) == "answer"
        assert not tasks_on(a.loop) and not tasks_on(b.loop)
    finally:
        a.stop()
        b.stop()


def test_a_blocking_stream_on_another_loops_thread_still_streams(
    owner: lb.LoopThread, engine: Engine
) -> None:
    """No cycle: a blocking stream consumed on another loop's thread (asyncio and
    uvloop owners) waits and streams as before; its later waits are checked, and a
    next() served from delivered items is not."""
    checks: list[str] = []
    real = _streams.check_block

    def counting(op: Any, owner_port: Any, here: Any) -> None:
        checks.append(op.description)
        real(op, owner_port, here)

    other = lb.LoopThread(name="loop-B").start()
    try:

        async def on_b() -> tuple[list[int], int]:
            items = lb.blocking(lb.proxy(engine), timeout=30).count(3)
            got = [next(items)]  # waits: checked
            assert len(checks) == 1
            await until_set(engine.count_finished)  # the other two are delivered
            got += [next(items), next(items)]  # served from the buffer: not checked
            served = len(checks)
            got += list(items)  # the end (a wait, if it is not recorded yet)
            slow = lb.blocking(lb.proxy(engine), timeout=30).count(3, 0.001)
            return got + list(slow), served

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_streams, "check_block", counting)
            got, served = other.run(on_b)
        assert got == [0, 1, 2, 0, 1, 2]
        assert served == 1
        assert "Engine.count()" in checks[0]
        assert not tasks_on(owner.loop)
    finally:
        other.stop()


# ------------------------------------------------- an owner method that stops its loop
# Issue 33, point 10: KeyboardInterrupt and SystemExit in an owner method stop the
# owner loop, as they do in asyncio.
# The owner's thread ends with the SystemExit: that is the behaviour pinned here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_system_exit_in_an_owner_method_stops_the_owner_loop(owner: lb.LoopThread) -> None:
    """As in asyncio: the exception reaches the caller, and it also propagates out of
    the owner loop, which stops; its callers then get OwnerLoopClosed."""

    async def make() -> Service:
        return Service()

    p = lb.proxy(owner.run(make))

    async def main() -> None:
        with pytest.raises(SystemExit):
            await p.exit()
        await asyncio.to_thread(owner._thread.join, 30)  # type: ignore[union-attr]
        with pytest.raises(lb.OwnerLoopClosed):
            await asyncio.wait_for(p.get(), 30)

    asyncio.run(main())
    assert not owner.running
