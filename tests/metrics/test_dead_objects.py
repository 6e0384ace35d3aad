"""A collected loop-affine object costs nothing for long, whether or not anyone
reads the metrics (:mod:`loopbridge._metrics`): its numbers are folded into its
name's totals soon after it goes, so the dead list stays bounded however many
objects come and go, and the totals a reader then sees are unchanged.

(The full-size check, RSS over a million calls and 100,000 objects in a process
that never reads its metrics, is ``soak/metrics_memory.py``.)
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import _metrics
from loopbridge.metrics import metrics_of, snapshot

#: Many times the dead list's bound (about 30 folds), made, called and dropped
#: in batches: 400 cross-thread round trips rather than 8,000.  The full-size
#: check is the soak's.
OBJECTS = 2_000
#: Objects made in one owner step, called at once, then dropped together.
BATCH = 20
#: What the dead list may hold: its bound, plus the objects that died since the
#: last one was made (a batch here: each is dropped before the next is made).
FOLD_DEAD_AT = getattr(_metrics, "_FOLD_DEAD_AT", 64)  # 45500bb had no bound
BOUND = FOLD_DEAD_AT + BATCH


@lb.loop_affine
class Short:
    """Made and dropped by the thousand; one call each."""

    async def ping(self) -> int:
        return 1


@lb.loop_affine
class Streams:
    async def three(self) -> AsyncIterator[int]:
        for i in range(3):
            yield i


async def _make_shorts() -> list[Short]:
    return [Short() for _ in range(BATCH)]


async def _make_streams() -> Streams:
    return Streams()


async def _nothing() -> None:
    """One step on the owner loop: every callback it ran before has returned."""


def _fields(name: str) -> dict[str, Any]:
    """The process-wide totals of ``name`` (zeros if it never appeared)."""
    return snapshot()["objects"].get(name) or {  # type: ignore[no-any-return]
        "calls": 0, "ok": 0, "streams": 0, "stream_items": 0, "streams_completed": 0,
        "run": {"count": 0},
    }  # fmt: skip


def test_dead_objects_stay_bounded_without_a_reader(asyncio_owner: lb.LoopThread) -> None:
    """2,000 objects made, called once across loops and dropped, no reader
    meanwhile: the dead list never holds more than its bound, and the totals
    a reader then sees count every call."""
    gc.collect()
    before = _fields("Short object")
    owner_loop = asyncio_owner.loop
    longest = 0

    async def churn() -> int:
        nonlocal longest
        total = 0
        for _ in range(OBJECTS // BATCH):
            made = asyncio.run_coroutine_threadsafe(_make_shorts(), owner_loop)
            batch = [lb.proxy(obj) for obj in await asyncio.wrap_future(made)]
            total += sum(await asyncio.gather(*(p.ping() for p in batch)))
            del made, batch  # dropped before the next batch is made
            longest = max(longest, len(_metrics._dead))
        return total

    assert asyncio.run(churn()) == OBJECTS
    assert longest <= BOUND, longest
    assert len(_metrics._live) < 1000  # the live ones went too
    gc.collect()
    after = _fields("Short object")  # a reader folds the rest
    assert not _metrics._dead
    assert after["calls"] - before["calls"] == OBJECTS
    assert after["ok"] - before["ok"] == OBJECTS
    assert after["run"]["count"] - before["run"]["count"] == OBJECTS


def test_folded_totals_equal_what_each_object_recorded(asyncio_owner: lb.LoopThread) -> None:
    """Streams of objects that died, folded without a reader in between, add up
    exactly to what each object's own snapshot said before it went."""
    gc.collect()
    before = _fields("Streams object")

    async def use(p: Streams) -> list[int]:
        return [i async for i in p.three()]

    seen: list[dict[str, Any]] = []
    for _ in range(3 * FOLD_DEAD_AT):
        p = lb.proxy(asyncio_owner.run(_make_streams))
        assert asyncio.run(use(p)) == [0, 1, 2]
        # The consumer can see the end before the owner thread has left the settle
        # that published it, and the side that comes second counts the stream
        # completed (here the owner: 1 of 192 on 3.13t in a soak run): a later step
        # on the owner loop comes after that.
        asyncio_owner.run(_nothing)
        seen.append(metrics_of(p).snapshot())
        del p
        assert len(_metrics._dead) <= BOUND
    gc.collect()
    after = _fields("Streams object")
    for field in ("streams", "stream_items", "streams_completed", "stream_batches"):
        want = sum(s[field] for s in seen)
        assert after.get(field, 0) - before.get(field, 0) == want, field


def test_a_few_samples_fold_where_observe_puts_them() -> None:
    """A retired object's handful of samples takes the per-sample path of the
    bulk fold and ``observe_all``: every bucket, count, sum and max as one by one."""
    import random
    from collections import deque

    from loopbridge._histogram import BUCKETS, Histogram, observe_all

    rng = random.Random(53)
    for n in range(12):
        values = [rng.choice([rng.expovariate(1e5), rng.choice(BUCKETS), 1e9]) for _ in range(n)]
        bulk, one = Histogram(), Histogram()
        observe_all(bulk, list(values))
        for v in values:
            one.observe(v)
        assert (bulk.counts, bulk.n, bulk.max) == (one.counts, one.n, one.max)
        assert bulk.total == pytest.approx(one.total, rel=1e-12)  # sum() may compensate
        samples = [(0.0, v, v + 1e-6, v + 3e-6) for v in values]
        folded = Histogram(), Histogram(), Histogram()
        _metrics._fold_latencies(deque(samples), *folded)
        assert [h.n for h in folded] == [n, n, n]
