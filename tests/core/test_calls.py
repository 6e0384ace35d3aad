"""Calls across loops: results, errors, context, cancellation both ways."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import traceback

import pytest

import loopbridge as lb

from .conftest import Engine, cancel_once_sleeping, tasks_on, until_set

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def test_result_comes_back_from_the_owner_loop(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        assert await p.echo({"x": 1}) == {"x": 1}
        assert await p.where() is owner.loop
        results = await asyncio.gather(*(p.echo(i) for i in range(200)))
        assert results == list(range(200))

    asyncio.run(main())


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


def test_unsupported_context_is_a_typed_error(engine: Engine) -> None:
    p = lb.proxy(engine)
    coro = p.echo(1)  # created outside any loop: decided when awaited

    async def driver() -> None:
        await coro

    # Driving the coroutine by hand (no loop, no trio) must fail clearly.
    gen = driver().__await__()
    with pytest.raises(lb.LoopAffinityError, match=r"loopbridge\.blocking\(p\)\.echo\(\.\.\.\)"):
        gen.send(None)


_where = contextvars.ContextVar("where", default="unset")


@lb.loop_affine
class Reader:
    async def read(self) -> str:
        return _where.get()


def test_a_call_carries_the_context_of_whoever_awaits_it(owner: lb.LoopThread) -> None:
    """As a native coroutine would: the context is taken when the call starts."""

    async def make() -> Reader:
        return Reader()

    p = lb.proxy(owner.run(make))

    async def main() -> str:
        _where.set("when created")
        coro = p.read()
        _where.set("when awaited")
        return await coro

    assert asyncio.run(main()) == "when awaited"
