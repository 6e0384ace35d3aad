"""Log2 histograms with Prometheus' bucket semantics (a leaf: imports nothing of ours).

A sample goes to the first bucket whose upper bound is >= it, so a value equal
to a bound counts in that bound's bucket, as Prometheus' ``le`` says.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

__all__ = ["BUCKETS", "ITEM_BUCKETS", "Histogram", "observe_all"]

#: Upper bounds (seconds) of latency buckets: 1 µs, 2 µs, 4 µs ... ~134 s, then +Inf.
BUCKETS: tuple[float, ...] = tuple(2.0**i / 1e6 for i in range(28))
#: Upper bounds of item-count buckets (items per wake-up): 1, 2, 4 ... 2**27, then +Inf.
ITEM_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(28))
_NB = len(BUCKETS)
#: Below this many samples, observe_all bisects per sample, not per bound.
_FEW = 8


class Histogram:
    """Log2 buckets: a sample goes to the first bucket whose bound is >= it
    (Prometheus' ``le``: a value equal to a bound counts in that bound's bucket).

    ``items=False``: seconds, bounds :data:`BUCKETS`.  ``items=True``: counts of
    items, bounds :data:`ITEM_BUCKETS` (exact: a batch of 3 lands in "<= 4").
    """

    __slots__ = ("counts", "total", "n", "max", "items")

    def __init__(self, items: bool = False) -> None:
        self.counts = [0] * (_NB + 1)
        self.total = 0.0
        self.n = 0
        self.max = 0.0
        self.items = items

    @property
    def bounds(self) -> tuple[float, ...]:
        return ITEM_BUCKETS if self.items else BUCKETS

    def observe(self, value: float) -> None:
        if self.items:
            v = int(value)  # an integer count: v <= 2**i exactly when (v - 1) < 2**i
            i = (v - 1).bit_length() if v > 0 else 0
        else:
            i = bisect_left(BUCKETS, value)  # the first bound >= value (Prometheus' le)
        self.counts[i if i < _NB else _NB] += 1
        self.total += value
        self.n += 1
        if value > self.max:
            self.max = value

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.total += other.total
        self.n += other.n
        if other.max > self.max:
            self.max = other.max

    def copy(self) -> Histogram:
        h = Histogram(self.items)
        h.merge(self)
        return h

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket that holds quantile ``q`` (conservative)."""
        if not self.n:
            return None
        rank = q * self.n
        seen = 0
        bounds = self.bounds
        for i, c in enumerate(self.counts):
            seen += c
            if c and seen >= rank:
                return bounds[i] if i < _NB else float("inf")
        return float("inf")  # pragma: no cover - seen reaches n

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, samples <= bound)`` for every bucket, +Inf last."""
        out: list[tuple[float, int]] = []
        seen = 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts):
            seen += c
            out.append((bound, seen))
        return out

    def as_dict(self) -> dict[str, Any]:
        unit = "" if self.items else "_s"
        return {
            "count": self.n,
            f"sum{unit}": self.total,
            f"max{unit}": self.max if self.n else None,
            f"p50_le{unit}": self.quantile(0.5),
            f"p99_le{unit}": self.quantile(0.99),
            "buckets": [[b, c] for b, c in zip((*self.bounds, float("inf")), self.counts) if c],
        }


def observe_all(h: Histogram, values: list[float]) -> None:
    """``h.observe(v)`` for each latency in ``values``, in bulk (same buckets)."""
    if not values:
        return
    h.total += sum(values)  # before sorting: the same summation order as one by one
    h.n += len(values)
    counts = h.counts
    if len(values) < _FEW:
        # A few samples (an object retired after a handful of calls): one
        # bisection each costs less than one per bound.
        for v in values:
            i = bisect_left(BUCKETS, v)  # the first bound >= v, as observe() says
            counts[i if i < _NB else _NB] += 1
        top = max(values)
        if top > h.max:
            h.max = top
        return
    values.sort()
    if values[-1] > h.max:
        h.max = values[-1]
    # Bucket i holds BUCKETS[i-1] < v <= BUCKETS[i], as Prometheus' "le" (and
    # Histogram.observe) say: count them with one bisection per bound.
    below = 0
    for i, bound in enumerate(BUCKETS):
        upto = bisect_right(values, bound)
        counts[i] += upto - below
        below = upto
    counts[_NB] += len(values) - below
