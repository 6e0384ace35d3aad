"""The Prometheus collector exports the real numbers of real cross-loop calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from metrics_support import apoll_until, poll_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import loopbridge as lb
import loopbridge.metrics
from loopbridge.metrics import monitor_lag
from loopbridge.metrics.prometheus import LoopbridgeCollector


@lb.loop_affine
class PromEngine:
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.holding = 0

    async def echo(self, x: int) -> int:
        return x

    async def fail(self) -> None:
        raise ValueError("bad")

    async def held(self) -> None:
        self.holding += 1
        await self.gate.wait()
        await asyncio.sleep(0.05)  # then works a while: a run time past the 32 ms bucket

    async def open_gate(self) -> None:
        self.gate.set()

    async def count(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


async def _make() -> PromEngine:
    return PromEngine()


OBJ = "PromEngine object"


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` from the text exposition."""
    text = generate_latest(registry).decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_collector_reports_real_calls_streams_and_lag(asyncio_owner: lb.LoopThread) -> None:
    registry = CollectorRegistry()
    registry.register(LoopbridgeCollector())
    engine = asyncio_owner.run(_make)
    p = lb.proxy(engine)
    mon = monitor_lag(asyncio_owner.loop, interval=0.01, name="prom-owner")

    async def main() -> None:
        for i in range(25):
            assert await p.echo(i) == i
        for _ in range(2):
            with pytest.raises(ValueError):
                await p.fail()
        assert [i async for i in p.count(300)] == list(range(300))
        held = [asyncio.create_task(p.held()) for _ in range(3)]
        await apoll_until(lambda: engine.holding == 3, "three calls are held on the owner")
        during = scrape(registry)
        assert value(during, "loopbridge_calls_in_flight", object=OBJ) == 3
        assert value(during, "loopbridge_calls_total", object=OBJ) == 30
        await p.open_gate()
        await asyncio.gather(*held)

    try:
        asyncio.run(main())
        asyncio_owner.loop.call_soon_threadsafe(time.sleep, 0.12)  # a blocked owner loop
        poll_until(lambda: mon.max_s >= 0.1, "the lag monitor saw the blocked loop")
        s = scrape(registry)
    finally:
        mon.stop()

    assert value(s, "loopbridge_calls_total", object=OBJ) == 31
    assert value(s, "loopbridge_calls_ended_total", object=OBJ, outcome="ok") == 29
    assert value(s, "loopbridge_calls_ended_total", object=OBJ, outcome="error") == 2
    assert value(s, "loopbridge_calls_ended_total", object=OBJ, outcome="cancelled") == 0
    assert value(s, "loopbridge_calls_in_flight", object=OBJ) == 0
    assert value(s, "loopbridge_streams_total", object=OBJ) == 1
    assert value(s, "loopbridge_streams_ended_total", object=OBJ, outcome="completed") == 1
    assert value(s, "loopbridge_stream_items_total", object=OBJ) == 300
    wakeups = value(s, "loopbridge_stream_wakeups_total", object=OBJ)
    assert 1 <= wakeups <= 300
    assert value(s, "loopbridge_stream_items_per_wakeup_sum", object=OBJ) == 300
    assert value(s, "loopbridge_stream_items_per_wakeup_count", object=OBJ) == wakeups

    # Histograms: one admission sample per call and stream, one run sample per
    # call, cumulative buckets ending in +Inf == count, sums agree with snapshot.
    snap = lb.metrics.metrics_of(p).snapshot()
    assert value(s, "loopbridge_admission_seconds_count", object=OBJ) == 32
    assert value(s, "loopbridge_run_seconds_count", object=OBJ) == 31
    assert value(s, "loopbridge_return_seconds_count", object=OBJ) == 31
    assert value(s, "loopbridge_run_seconds_sum", object=OBJ) == pytest.approx(snap["run"]["sum_s"])
    for hist in ("admission", "run", "return"):
        name = f"loopbridge_{hist}_seconds_bucket"
        buckets = sorted(
            (float(dict(labels)["le"]), v)
            for (n, labels), v in s.items()
            if n == name and dict(labels)["object"] == OBJ
        )
        counts = [v for _, v in buckets]
        assert counts == sorted(counts)  # cumulative
        assert buckets[-1] == (
            float("inf"),
            value(s, f"loopbridge_{hist}_seconds_count", object=OBJ),
        )
    # The held calls ran at least 50 ms: they are above the 32 ms bucket.
    assert value(s, "loopbridge_run_seconds_bucket", object=OBJ, le="0.032768") <= 28

    # The lag monitor of the blocked owner loop.
    assert value(s, "loopbridge_loop_lag_max_seconds", loop="prom-owner") >= 0.1
    lag_count = value(s, "loopbridge_loop_lag_seconds_count", loop="prom-owner")
    assert lag_count >= 2
    assert value(s, "loopbridge_loop_lag_seconds_bucket", loop="prom-owner", le="+Inf") == lag_count
    assert (
        value(s, "loopbridge_loop_lag_seconds_bucket", loop="prom-owner", le="0.065536") < lag_count
    )

    # Stopped monitors are no longer exported.
    assert not [k for k in scrape(registry) if dict(k[1]).get("loop") == "prom-owner"]


@lb.loop_affine
class ReadsAhead:
    async def three(self) -> AsyncIterator[int]:  # a generator member: batched, reads ahead
        for i in range(3):
            yield i


OBJ_AHEAD = "ReadsAhead object"


def test_collector_exports_items_read_ahead_and_never_delivered(
    asyncio_owner: lb.LoopThread,
) -> None:
    registry = CollectorRegistry()
    registry.register(LoopbridgeCollector())

    async def make() -> ReadsAhead:
        return ReadsAhead()

    p = lb.proxy(asyncio_owner.run(make), stream_window=8)
    snap = lb.metrics.metrics_of(p).snapshot

    async def main() -> int:
        it = p.three().__aiter__()
        first = await it.__anext__()
        # The owner's generator ran to its end: items 1 and 2 wait in the buffer.
        # (Not counted completed: that waits for the consumer, who leaves them.)
        ch = object.__getattribute__(it, "_ch")
        await apoll_until(lambda: ch.outcome.value == "ok", "the generator ended")
        await it.aclose()  # the consumer leaves: both are lost to it
        return first

    assert value(scrape(registry), "loopbridge_stream_items_unread_total", object=OBJ_AHEAD) == 0
    assert asyncio.run(main()) == 0
    assert snap()["stream_items_unread"] == 2
    assert (snap()["streams_completed"], snap()["streams_cancelled"]) == (0, 1)
    s = scrape(registry)
    assert value(s, "loopbridge_stream_items_unread_total", object=OBJ_AHEAD) == 2
    assert value(s, "loopbridge_stream_items_total", object=OBJ_AHEAD) == 1


def test_registration_is_described_and_checked() -> None:
    registry = CollectorRegistry()
    registry.register(LoopbridgeCollector(namespace="lbtest"))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(LoopbridgeCollector(namespace="lbtest"))
    with pytest.raises(ValueError, match="namespace"):
        LoopbridgeCollector(namespace="bad-name")
    text = generate_latest(registry).decode()
    assert "# TYPE lbtest_calls_total counter" in text
    assert "# TYPE lbtest_admission_seconds histogram" in text
    assert "# TYPE lbtest_stream_items_unread_total counter" in text
