"""Many threads and loops at once, and random interleavings of call, cancel and close."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loopbridge as lb
import loopbridge.metrics

from .conftest import Engine, hang_dump, tasks_on, within


def test_many_loops_and_threads_at_once(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine, stream_window=8)
    b = lb.blocking(p)
    errors: list[BaseException] = []

    def loop_worker(seed: int) -> None:
        rng = random.Random(seed)

        async def main() -> None:
            async def call(i: int) -> None:
                assert await p.echo(i) == i

            async def stream(n: int) -> None:
                assert [x async for x in p.count(n)] == list(range(n))

            async def cancelled() -> None:
                t = asyncio.ensure_future(p.sleep(10))
                await _turns(rng.randrange(30))  # cancel before, as or after it starts
                t.cancel()
                try:
                    await t
                except asyncio.CancelledError:
                    pass

            jobs: list[Any] = []
            for i in range(150):
                r = rng.random()
                jobs.append(
                    call(i) if r < 0.7 else stream(rng.randint(0, 60)) if r < 0.9 else cancelled()
                )
            await asyncio.gather(*jobs)

        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    def thread_worker(seed: int) -> None:
        try:
            for i in range(100):
                assert b.echo(i) == i
            assert list(b.count(300)) == list(range(300))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop_worker, args=(k,)) for k in range(6)]
    threads += [threading.Thread(target=thread_worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, hang_dump(f"threads still running after 120 s: {hung}")
    assert not errors, errors[:3]
    assert not tasks_on(owner.loop)
    snap = lb.metrics.metrics_of(p).snapshot()
    assert snap["in_flight"] == 0, snap


async def _turns(n: int) -> None:
    """Let the caller's loop run ``n`` times round: a point in the other side's
    progress chosen by count, not by the clock."""
    for _ in range(n):
        await asyncio.sleep(0)


_owner: lb.LoopThread | None = None


def _shared_owner() -> lb.LoopThread:
    global _owner
    if _owner is None or not _owner.running:
        _owner = lb.LoopThread(name="hypothesis-owner").start()
    return _owner


op = st.one_of(
    st.tuples(st.just("call"), st.integers(0, 3)),
    st.tuples(st.just("slow"), st.floats(0, 0.02)),
    st.tuples(st.just("stream"), st.integers(0, 50), st.integers(1, 20)),
    st.tuples(st.just("cancel_after"), st.integers(0, 30)),
    st.tuples(st.just("break_after"), st.integers(0, 10)),
    st.tuples(st.just("kill_owner"), st.integers(0, 30)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(op, min_size=1, max_size=8))
def test_random_interleavings_leave_nothing_behind(ops: list[tuple[Any, ...]]) -> None:
    owner = lb.LoopThread(name="interleave-owner").start()

    async def make() -> Engine:
        return Engine()

    engine = owner.run(make)
    p = lb.proxy(engine, stream_window=4, cancel_grace=1.0)
    killed = threading.Event()

    async def one(spec: tuple[Any, ...]) -> None:
        kind = spec[0]
        try:
            if kind == "call":
                assert await p.echo(spec[1]) == spec[1]
            elif kind == "slow":
                await p.sleep(spec[1])
            elif kind == "stream":
                got = [x async for x in lb.proxy(engine, stream_window=spec[2]).count(spec[1])]
                assert got == list(range(spec[1]))
            elif kind == "cancel_after":
                t = asyncio.ensure_future(p.sleep(5))
                await _turns(spec[1])
                t.cancel()
                try:
                    await t
                except asyncio.CancelledError:
                    pass
            elif kind == "break_after":
                async for x in p.count(10**6):
                    if x >= spec[1]:
                        break
            elif kind == "kill_owner":
                await _turns(spec[1])
                killed.set()
                await asyncio.get_running_loop().run_in_executor(None, owner.stop)
        except lb.OwnerLoopClosed:
            assert killed.is_set()

    async def main() -> None:
        await within(asyncio.gather(*(one(s) for s in ops)), 20, f"ops={ops!r}")

    try:
        asyncio.run(main())
        if not killed.is_set():
            gc.collect()
            # Nothing left behind on the owner: no tasks, nothing in flight.
            for _ in range(50):
                if not tasks_on(owner.loop):
                    break
                threading.Event().wait(0.02)
            assert not tasks_on(owner.loop)
            assert lb.metrics.metrics_of(p).snapshot()["in_flight"] == 0
    finally:
        owner.stop()
