"""Log2 histograms (:mod:`loopbridge._histogram`): buckets follow Prometheus' ``le``,
so a value equal to a bound counts in that bound's bucket.  Checked against
prometheus_client's own histogram at every bound."""

from __future__ import annotations

import math

import prometheus_client

from loopbridge._histogram import BUCKETS, ITEM_BUCKETS, Histogram, observe_all


def _at_and_around(bounds: tuple[float, ...]) -> list[float]:
    values = [0.0]
    for b in bounds:
        values += [math.nextafter(b, 0.0), b, math.nextafter(b, math.inf)]
    return values + [bounds[-1] * 3]


def _prometheus_cumulative(bounds: tuple[float, ...], values: list[float]) -> list[int]:
    registry = prometheus_client.CollectorRegistry()
    h = prometheus_client.Histogram(
        "h", "reference", buckets=(*bounds, math.inf), registry=registry
    )
    for v in values:
        h.observe(v)
    samples = registry.get_sample_value
    return [
        int(samples("h_bucket", {"le": prometheus_client.utils.floatToGoString(b)}) or 0)
        for b in (*bounds, math.inf)
    ]


def _ours_cumulative(h: Histogram) -> list[int]:
    return [c for _, c in h.cumulative()]


def test_latency_buckets_match_prometheus_at_every_bound() -> None:
    values = _at_and_around(BUCKETS)
    one_by_one = Histogram()
    for v in values:
        one_by_one.observe(v)
    bulk = Histogram()
    observe_all(bulk, list(values))
    want = _prometheus_cumulative(BUCKETS, values)
    assert _ours_cumulative(one_by_one) == want
    assert _ours_cumulative(bulk) == want


def test_item_buckets_match_prometheus_at_every_bound() -> None:
    values = [float(v) for v in range(0, 70)] + [float(2**27), float(2**27 + 1)]
    h = Histogram(items=True)
    for v in values:
        h.observe(v)
    assert _ours_cumulative(h) == _prometheus_cumulative(ITEM_BUCKETS, values)


def test_a_value_equal_to_a_bound_is_in_that_bucket() -> None:
    h = Histogram()
    h.observe(BUCKETS[3])  # 8 µs
    assert h.quantile(1.0) == BUCKETS[3]
