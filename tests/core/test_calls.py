"""Calls across loops: results, errors, context, cancellation both ways."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import traceback
from typing import Any

import pytest

import loopbridge as lb
import loopbridge.metrics

from .conftest import Engine, cancel_once_sleeping, tasks_on, until_set
from .interleave import Interleaving

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def test_result_comes_back_from_the_owner_loop(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        assert await p.echo({"x": 1}) == {"x": 1}
        assert await p.where() is owner.loop
        results = await asyncio.gather(*(p.echo(i) for i in range(200)))
        assert results == list(range(200))

    asyncio.run(main())


def test_proxy_is_an_instance_of_the_real_class(engine: Engine) -> None:
    p = lb.proxy(engine)
    assert isinstance(p, Engine)
    assert lb.proxy(p) is p
    assert p.name == "engine"  # stable
    assert p.describe() == "engine engine"  # thread-safe


def test_sync_members_are_refused_with_a_clear_error(engine: Engine) -> None:
    p = lb.proxy(engine)
    with pytest.raises(lb.LoopAffinityError, match=r"stable=.*threadsafe="):
        p.bump()
    with pytest.raises(lb.LoopAffinityError, match="'log'"):
        _ = p.log  # instance attribute, not declared
    with pytest.raises(lb.LoopAffinityError, match="cannot set"):
        p.name = "other"
    with pytest.raises(AttributeError):
        _ = p.no_such_member
    assert engine.counter == 0


def test_exception_is_the_original_object_with_traceback_and_note(
    owner: lb.LoopThread, engine: Engine
) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        with pytest.raises(ValueError, match="boom") as info:
            await p.fail("boom")
        exc = info.value
        frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        assert "fail" in frames  # the owner-side frame is there
        notes = getattr(exc, "__notes__", [])
        assert any("Engine.fail()" in n and "owner loop" in n for n in notes), notes

    asyncio.run(main())


def test_contextvars_are_copied_into_the_owner_task(engine: Engine) -> None:
    @lb.loop_affine
    class Reader:
        async def read(self) -> str:
            value = request_id.get()
            request_id.set("changed on owner")  # must not leak back
            return value

    async def make() -> Reader:
        return Reader()

    owner_thread = lb.LoopThread().start()
    try:
        p = lb.proxy(owner_thread.run(make))

        async def main() -> None:
            request_id.set("req-42")
            assert await p.read() == "req-42"
            assert request_id.get() == "req-42"

        asyncio.run(main())
    finally:
        owner_thread.stop()


def test_caller_cancel_cancels_owner_task_with_message_and_waits_for_cleanup(
    owner: lb.LoopThread, engine: Engine
) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        await cancel_once_sleeping(p, engine, "client went away")
        assert engine.log[0][2] is owner.loop  # the owner task was the one cancelled

    asyncio.run(main())
    assert not tasks_on(owner.loop)


def test_cancel_grace_is_bounded(asyncio_owner: lb.LoopThread) -> None:
    @lb.loop_affine
    class Stubborn:
        def __init__(self) -> None:
            self.holding = threading.Event()
            self.release = asyncio.Event()
            self.cleaned_up = False

        async def hold(self) -> None:
            self.holding.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await self.release.wait()  # a cleanup that never ends by itself
                self.cleaned_up = True
                raise

    async def make() -> Stubborn:
        return Stubborn()

    stubborn = asyncio_owner.run(make)
    p = lb.proxy(stubborn, cancel_grace=0.1)

    async def main() -> float:
        task = asyncio.create_task(p.hold())
        await until_set(stubborn.holding)
        t0 = asyncio.get_running_loop().time()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)  # without the grace bound: a hang
        return asyncio.get_running_loop().time() - t0

    waited = asyncio.run(main())
    # The caller stopped waiting after the grace period, while the owner's
    # cleanup was still running (it only ends when released below).
    assert waited >= 0.05
    assert not stubborn.cleaned_up
    asyncio_owner.loop.call_soon_threadsafe(stubborn.release.set)


def test_owner_side_cancel_reaches_the_caller_as_cancelled_error(
    owner: lb.LoopThread, engine: Engine
) -> None:
    p = lb.proxy(engine)

    async def cancel_owner_tasks() -> int:
        n = 0
        for t in asyncio.all_tasks():
            if t is not asyncio.current_task() and t.get_name() != "loopbridge-keeper":
                t.cancel("owner says no")
                n += 1
        return n

    async def main() -> None:
        task = asyncio.create_task(p.sleep(30))
        await until_set(engine.started["sleep"])
        assert (
            await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(cancel_owner_tasks(), owner.loop)
            )
            == 1
        )
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_same_loop_calls_go_straight_through(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine)

    async def on_owner() -> bool:
        coro = p.echo(1)
        # Straight through: the real coroutine, no bridging wrapper.
        direct = getattr(coro, "cr_code", None) is Engine.echo.__wrapped__.__code__  # type: ignore[attr-defined]
        assert await coro == 1
        return direct

    assert owner.run(on_owner)


def test_direct_cross_loop_call_is_caught(owner: lb.LoopThread, engine: Engine) -> None:
    async def main() -> None:
        with pytest.raises(lb.LoopAffinityError, match="proxy"):
            await engine.echo(1)

    asyncio.run(main())


def test_affinity_check_policy(owner: lb.LoopThread, engine: Engine) -> None:
    async def main() -> None:
        old = lb.set_affinity_check("warn")
        try:
            with pytest.warns(RuntimeWarning, match="proxy"):
                assert await engine.echo(1) == 1  # warned at its first step, then run here
            lb.set_affinity_check("off")
            assert await engine.echo(2) == 2  # no check at all
        finally:
            lb.set_affinity_check(old)
        with pytest.raises(ValueError):
            lb.set_affinity_check("sometimes")

    asyncio.run(main())


def test_not_loop_affine_is_a_typed_error() -> None:
    class Plain:
        async def go(self) -> None: ...

    with pytest.raises(lb.LoopAffinityError, match="adopt"):
        lb.proxy(Plain())


async def _make() -> Engine:
    return Engine()


def test_unsupported_context_is_a_typed_error(engine: Engine) -> None:
    p = lb.proxy(engine)
    coro = p.echo(1)  # created outside any loop: decided when awaited

    async def driver() -> None:
        await coro

    # Driving the coroutine by hand (no loop, no trio) must fail clearly.
    gen = driver().__await__()
    with pytest.raises(lb.LoopAffinityError, match="asyncio loop or trio"):
        gen.send(None)


def test_concurrent_calls_share_wake_ups(asyncio_owner: lb.LoopThread) -> None:
    """64 calls made in one loop iteration wake the owner loop once, and their 64
    results, posted while the caller's loop is busy, wake the caller once.

    The caller's loop is kept busy (blocked on an event) from the owner's wake
    until the owner has posted every result, so the counts do not depend on how
    the two threads are scheduled.  How often an idle caller on another core is
    woken is a matter of timing (``bench_bridge.py --count-wakes`` measures it).
    """
    from loopbridge._ports import port_for_loop

    p = lb.proxy(asyncio_owner.run(_make))
    owner_port = port_for_loop(asyncio_owner.loop)

    async def main(il: Interleaving) -> tuple[int, int]:
        caller_port = port_for_loop(asyncio.get_running_loop())
        await p.echo(0)  # warm up: ports exist
        before = owner_port.wakeups, caller_port.wakeups
        for _ in range(20):
            # The owner's 64 results, each appended to this loop's inbox.
            all_posted = il.count("post.appended", 64, thread=asyncio_owner.thread)
            woken = owner_port.wakeups
            calls = asyncio.gather(*(p.echo(i) for i in range(64)))
            # The calls submit in the next iteration, and their one wake of the
            # owner goes in the iteration after (the flush they deferred).  Let
            # both pass, then hold this loop until all 64 results are in its inbox.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert owner_port.wakeups == woken + 1
            all_posted.wait()
            assert await calls == list(range(64))
        return owner_port.wakeups - before[0], caller_port.wakeups - before[1]

    with Interleaving() as il:
        to_owner, to_caller = asyncio.run(main(il))
    # 1280 calls: without batching that is 1280 wake-ups each way.
    assert (to_owner, to_caller) == (20, 20)


def test_results_posted_from_the_drain_are_not_deferred(asyncio_owner: lb.LoopThread) -> None:
    """An eager call that finishes in the owner's drain posts its result from there.

    Woken by another thread, the owner loop still has its self-pipe reader
    queued behind the drain.  That reader posts nothing, so it is no reason to
    defer the caller's wake-up to a flush one loop iteration later.
    """
    from loopbridge._ports import port_for_loop

    p = lb.proxy(asyncio_owner.run(_make), eager=True)
    loop = asyncio_owner.loop
    owner_port = port_for_loop(loop)
    flushes: list[object] = []
    schedule = loop.call_soon

    def call_soon(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        if callback == owner_port._flush:
            flushes.append(callback)
        return schedule(callback, *args, **kwargs)

    async def main() -> None:
        assert await p.echo(0) == 0  # warm up: ports exist
        loop.call_soon = call_soon  # type: ignore[method-assign]
        try:
            for i in range(50):
                assert await p.echo(i) == i
        finally:
            del loop.call_soon

    asyncio.run(main())
    # One flush per call when the reader counted as more work; a flush is
    # still right when something else happens to be ready on the owner loop.
    assert len(flushes) < 10, len(flushes)


def test_is_proxy_and_unwrap(engine: Engine) -> None:
    p = lb.proxy(engine)
    assert lb.is_proxy(p) and not lb.is_proxy(engine)
    assert lb.unwrap(p) is engine
    assert lb.unwrap(engine) is engine


def test_eager_calls_keep_results_errors_and_cancellation(
    owner: lb.LoopThread, engine: Engine
) -> None:
    p = lb.proxy(engine, eager=True)

    async def main() -> None:
        assert await p.echo(3) == 3  # finishes in its first step: no task at all
        assert await p.where() is owner.loop  # suspends: continues in a task
        with pytest.raises(ValueError, match="eager"):
            await p.fail("eager")
        await cancel_once_sleeping(p, engine, "stop")

    asyncio.run(main())
    assert lb.blocking(p).echo(4) == 4
    assert not tasks_on(owner.loop)


def test_members_wrapped_by_decorators_keep_their_real_signature(
    asyncio_owner: lb.LoopThread,
) -> None:
    import functools

    def injects_retries(fn: Any) -> Any:
        @functools.wraps(fn)
        async def wrapper(self: Any, *args: Any, retries: int = 0, **kwargs: Any) -> Any:
            return (await fn(self, *args, **kwargs), retries)

        return wrapper

    @lb.loop_affine
    class Decorated:
        @injects_retries
        async def get(self, x: int) -> int:
            return x

    async def make() -> Decorated:
        return Decorated()

    p = lb.proxy(asyncio_owner.run(make))

    async def main() -> None:
        assert await p.get(1) == (1, 0)
        assert await p.get(2, retries=3) == (2, 3)  # accepted by the real wrapper

    asyncio.run(main())


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
