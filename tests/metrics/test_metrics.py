"""Per-object counters and latencies (:mod:`loopbridge._metrics`): the bulk latency
fold puts every sample where ``Histogram.observe`` would.  The counts after real
calls and streams are in test_snapshot.py."""

from __future__ import annotations

import random
from collections import deque

import pytest

from loopbridge._histogram import BUCKETS, Histogram
from loopbridge._metrics import _fold_latencies


@pytest.mark.parametrize("seed", range(5))
def test_bulk_fold_matches_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    samples = []
    for _ in range(3000):
        t = rng.random()
        start = t + rng.expovariate(rng.choice([1e2, 1e5, 1e7]))
        end = start + rng.expovariate(1e5)
        samples.append((t, start, end, rng.choice([0.0, end + 1e-4, end + 300.0])))
    samples += [(1.0, 1.0 + 3e-6, 0.0, 0.0)] * 50  # streams: admission only
    samples += [(0.0, bound, 0.0, 0.0) for bound in BUCKETS]  # exactly on each bound
    bulk = Histogram(), Histogram(), Histogram()
    queue = deque(samples)
    _fold_latencies(queue, *bulk)
    assert not queue
    one = Histogram(), Histogram(), Histogram()
    for t_submit, t_start, t_end, t_return in samples:
        one[0].observe(t_start - t_submit)
        if t_end:
            one[1].observe(t_end - t_start)
            if t_return:
                one[2].observe(t_return - t_end)
    for got, want in zip(bulk, one):
        assert got.counts == want.counts
        assert got.n == want.n
        assert got.max == want.max
        assert got.total == pytest.approx(want.total, rel=1e-12)
