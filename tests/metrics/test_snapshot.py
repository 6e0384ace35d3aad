"""Counters and latency histograms after real cross-loop calls and streams."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from metrics_support import apoll_until, poll_until

import loopbridge as lb
import loopbridge.metrics
from loopbridge.metrics import snapshot


def make_engine_class() -> type:
    """A fresh class per test: its name keys the process-wide per-object totals."""

    @lb.loop_affine
    class Engine:
        def __init__(self) -> None:
            self.release = asyncio.Event()
            self.napping = threading.Event()  # set on the owner: the nap began
            self.produced = 0

        async def echo(self, x: Any) -> Any:
            return x

        async def fail(self) -> None:
            raise KeyError("nope")

        async def nap(self, seconds: float) -> None:
            self.napping.set()
            await asyncio.sleep(seconds)

        async def hold(self) -> None:
            await self.release.wait()

        async def open_gate(self) -> None:
            self.release.set()

        async def count(self, n: int) -> AsyncIterator[int]:
            for i in range(n):
                self.produced = i + 1
                yield i
                if i % 100 == 99:
                    await asyncio.sleep(0)

    return Engine


def build(owner: lb.LoopThread, cls: type) -> Any:
    async def make() -> Any:
        return cls()

    return owner.run(make)


def test_call_outcomes_are_counted_exactly(owner: lb.LoopThread) -> None:
    engine = build(owner, make_engine_class())
    p = lb.proxy(engine)
    metrics = lb.metrics.metrics_of(p)

    async def main() -> None:
        for i in range(50):
            assert await p.echo(i) == i
        for _ in range(3):
            with pytest.raises(KeyError):
                await p.fail()
        # A caller cancelled while the owner runs the call.
        task = asyncio.create_task(p.nap(30))
        await apoll_until(engine.napping.is_set, "the nap started on the owner")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    snap = metrics.snapshot()
    assert snap["name"].endswith("Engine object")
    assert snap["calls"] == 54
    assert snap["ok"] == 50
    assert snap["errors"] == 3
    assert snap["cancelled"] == 1
    assert snap["caller_cancels"] == 1
    assert snap["calls_in_flight"] == 0 and snap["in_flight"] == 0
    # Every call started on the owner: one admission and one run sample each.
    assert snap["admission"]["count"] == 54
    assert snap["run"]["count"] == 54
    # The cancelled call returns through the cancel path, not the return path.
    assert snap["return"]["count"] == 53
    # The cancelled nap ran on the owner until the cancel reached it.
    assert snap["run"]["max_s"] > 0
    assert snap["run"]["buckets"][-1][0] >= snap["run"]["max_s"]
    assert sum(c for _, c in snap["run"]["buckets"]) == 54


def test_in_flight_counts_a_call_that_has_not_returned(asyncio_owner: lb.LoopThread) -> None:
    engine = build(asyncio_owner, make_engine_class())
    p = lb.proxy(engine)
    metrics = lb.metrics.metrics_of(p)

    async def main() -> None:
        holders = [asyncio.create_task(p.hold()) for _ in range(4)]
        await apoll_until(lambda: metrics.snapshot()["calls"] == 4, "all 4 calls were submitted")
        snap = metrics.snapshot()
        # Latency samples are taken when a call ends: none yet.
        assert snap["admission"]["count"] == 0 and snap["run"]["count"] == 0
        assert snap["calls_in_flight"] == 4
        assert snap["in_flight"] == 4
        assert snap["ok"] == 0
        await p.open_gate()
        await asyncio.gather(*holders)

    asyncio.run(main())
    snap = metrics.snapshot()
    assert snap["calls_in_flight"] == 0
    assert snap["ok"] == 5


def test_admission_delay_grows_when_the_owner_loop_is_busy(asyncio_owner: lb.LoopThread) -> None:
    engine = build(asyncio_owner, make_engine_class())
    p = lb.proxy(engine)
    metrics = lb.metrics.metrics_of(p)

    entered, submitted = threading.Event(), threading.Event()
    before: dict[str, Any] = {}  # the snapshot before the late call

    def busy_owner() -> None:
        # CPU-bound work on the owner loop that starts once the call is queued
        # behind it, so the call waits at least this long to be admitted.
        entered.set()
        submitted.wait(30)
        time.sleep(0.15)

    async def main() -> None:
        for i in range(20):
            await p.echo(i)
        before.update(metrics.snapshot())
        quiet = before["admission"]
        asyncio_owner.loop.call_soon_threadsafe(busy_owner)
        await apoll_until(entered.is_set, "the owner loop is busy")
        late = asyncio.ensure_future(p.echo("late"))
        await apoll_until(lambda: metrics.snapshot()["calls"] == 21, "the late call was submitted")
        submitted.set()
        await late
        busy = metrics.snapshot()["admission"]
        # The late call's own admission is what its one sample added to the sum. (Not the
        # maximum: on a starved machine a quiet call waited 0.22 s, longer than the late one.)
        assert busy["count"] == quiet["count"] + 1
        assert busy["sum_s"] - quiet["sum_s"] >= 0.15, (quiet, busy)

    asyncio.run(main())
    snap = metrics.snapshot()
    # Every call's admission is counted once, and the largest is in the highest
    # bucket. The late call's wait was admission: it did not run that long.
    buckets = snap["admission"]["buckets"]
    assert sum(count for _, count in buckets) == 21
    top_bound, top_count = buckets[-1]
    assert top_count >= 1 and top_bound >= snap["admission"]["max_s"]
    late_run = snap["run"]["sum_s"] - before["run"]["sum_s"]
    assert late_run < snap["admission"]["sum_s"] - before["admission"]["sum_s"]


def test_return_delay_grows_when_the_caller_loop_is_busy(asyncio_owner: lb.LoopThread) -> None:
    engine = build(asyncio_owner, make_engine_class())
    p = lb.proxy(engine)
    metrics = lb.metrics.metrics_of(p)

    def block_this_loop(seconds: float) -> None:
        time.sleep(seconds)  # CPU-bound work on the caller loop, in the test's story

    async def main() -> None:
        task = asyncio.create_task(p.hold())
        await apoll_until(lambda: metrics.snapshot()["calls"] == 1, "the call was submitted")
        # With this loop blocked: release the owner, wait until it has answered,
        # then stay blocked a while longer before the caller may resume.
        asyncio_owner.loop.call_soon_threadsafe(engine.release.set)
        poll_until(lambda: metrics.snapshot()["ok"] == 1, "the owner answered")
        block_this_loop(0.15)
        await task

    asyncio.run(main())
    snap = metrics.snapshot()
    assert snap["return"]["count"] == 1
    assert snap["return"]["max_s"] >= 0.15


def test_stream_items_and_wakeups(owner: lb.LoopThread) -> None:
    engine = build(owner, make_engine_class())
    p = lb.proxy(engine, stream_window=512)
    metrics = lb.metrics.metrics_of(p)

    async def main() -> None:
        got = 0
        async for _ in p.count(5000):
            got += 1
            if got % 250 == 0:
                # A busy consumer: wait until items have piled up (a quarter window).
                target = min(5000, got + 128)
                await apoll_until(lambda t=target: engine.produced >= t, "items piled up")
        assert got == 5000
        # Abandoned after 10 items (break): cancelled on the owner.
        stream = p.count(10_000)
        async for i in stream:
            if i == 9:
                break
        del stream
        # Closed explicitly after 3 items.
        stream2 = p.count(10_000)
        for _ in range(3):
            await stream2.__anext__()
        await stream2.aclose()

    asyncio.run(main())
    gc.collect()
    poll_until(lambda: not metrics.snapshot()["streams_open"], "every stream has ended")
    snap = metrics.snapshot()
    assert snap["streams"] == 3
    assert snap["streams_completed"] == 1
    assert snap["streams_cancelled"] == 2
    assert (
        snap["consumer_closes"] == 1
    )  # only the explicit aclose(); a break is not a close request
    assert snap["streams_open"] == 0 and snap["in_flight"] == 0
    # Items delivered to the consumer, exactly.
    assert snap["stream_items"] == 5000 + 10 + 3
    assert snap["batch_size"]["sum"] == 5013
    assert snap["batch_size"]["count"] == snap["stream_batches"]
    assert snap["items_per_wakeup"] == pytest.approx(5013 / snap["stream_batches"])
    # Batched hand-over: far fewer wake-ups than items.
    assert snap["stream_batches"] < 5013 / 10
    assert snap["admission"]["count"] == 3  # streams have admission samples too
    assert snap["calls"] == 0 and snap["run"]["count"] == 0


def test_blocking_face_from_threads_counts_exactly(asyncio_owner: lb.LoopThread) -> None:
    engine = build(asyncio_owner, make_engine_class())
    b = lb.blocking(engine)
    metrics = lb.metrics.metrics_of(lb.proxy(engine))

    def worker() -> None:
        for i in range(200):
            assert b.echo(i) == i
        assert list(b.count(300)) == list(range(300))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = metrics.snapshot()
    assert snap["calls"] == snap["ok"] == 800
    assert snap["streams"] == snap["streams_completed"] == 4
    assert snap["stream_items"] == 1200
    assert snap["admission"]["count"] == 804
    assert snap["in_flight"] == 0


def test_totals_sum_objects_and_survive_garbage_collection(asyncio_owner: lb.LoopThread) -> None:
    A, B = make_engine_class(), make_engine_class()
    A.__qualname__, B.__qualname__ = "MetricsTotalsA", "MetricsTotalsB"

    async def make_pair() -> tuple[Any, Any, Any]:
        return A(), A(), B()

    a1, a2, b1 = asyncio_owner.run(make_pair)

    async def main(calls: list[tuple[Any, int]]) -> None:
        for obj, n in calls:
            p = lb.proxy(obj)
            for i in range(n):
                await p.echo(i)

    before = snapshot()
    asyncio.run(main([(a1, 7), (a2, 5), (b1, 2)]))
    after = snapshot()
    assert after["objects"]["MetricsTotalsA object"]["calls"] == 12
    assert after["objects"]["MetricsTotalsB object"]["calls"] == 2
    assert after["calls"] - before["calls"] >= 14
    assert after["ok"] - before["ok"] >= 14

    # Drop every object of class A: its numbers stay counted (Prometheus
    # counters must never go down).
    del a1, a2
    gc.collect()
    later = snapshot()
    assert later["objects"]["MetricsTotalsA object"]["calls"] == 12
    assert later["objects"]["MetricsTotalsA object"]["admission"]["count"] == 12
    assert later["calls"] >= after["calls"]
    del b1
