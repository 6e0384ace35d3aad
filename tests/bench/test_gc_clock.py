"""The benchmarks' garbage-collector bookkeeping (loopbridge_bench.common.gc_clock)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from loopbridge_bench.common.gc_clock import GcClock, settle


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Leave the test process's collector with nothing frozen."""
    yield
    gc.unfreeze()


def test_the_clock_counts_full_collections_only() -> None:
    clock = GcClock()
    try:
        before = clock.snapshot()
        gc.collect(0)
        gc.collect(1)
        assert clock.since(before) == (0, 0.0)
        gc.collect()
        count, seconds = clock.since(before)
        assert count == 1 and seconds > 0
    finally:
        clock.close()
    clock.close()  # twice: harmless
    gc.collect()
    assert clock.count == 1  # no longer counting


def test_settle_freezes_what_survived_so_a_full_collection_skips_it(unfrozen: None) -> None:
    records = [[i] for i in range(20_000)]  # tracked containers, as a run's samples are
    assert all(gc.is_tracked(r) for r in records)
    before = gc.get_freeze_count()
    settle()
    assert gc.get_freeze_count() >= before + len(records)
    # A full collection from now on walks none of them: none is in a generation.
    gc.collect()
    walked = {id(o) for o in gc.get_objects()}
    assert not any(id(r) in walked for r in records)
    # The next job's survivors are frozen by the next settle, on top.
    more = [[i] for i in range(1_000)]
    live = {id(o) for o in gc.get_objects()}
    assert all(id(r) in live for r in more)
    frozen = gc.get_freeze_count()
    settle()
    assert gc.get_freeze_count() >= frozen + len(more)
