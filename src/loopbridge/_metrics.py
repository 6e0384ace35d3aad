"""Counters and latency histograms for calls and streams across loops.

Each loop-affine object has one :class:`Stats` (shared by all its proxies); the
process-wide total is summed over them when read.  The hot path must stay far
below the cost of a cross-thread hop (about 20 µs), so recording is split:

* counters are ``itertools.count`` objects: ``next()`` is atomic under the GIL,
  exact from any number of threads, and costs about 40 ns;
* latencies are appended as raw samples to a ``deque`` (an atomic append) and
  folded into histogram buckets in batches, by whichever thread pushes the
  batch over its size, or by a reader.

Latencies are split where the time goes:

* *admission*: submitted on the caller until it starts on the owner loop; this
  grows when the owner loop is busy, which is what makes a served p99 grow;
* *run*: running on the owner loop;
* *return*: finished on the owner until the caller resumes.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import deque
from typing import Any

__all__ = ["Stats", "Histogram", "BUCKETS", "snapshot", "all_stats"]

_OK, _ERROR, _CANCELLED = 1, 2, 3

#: Upper bounds (seconds) of histogram buckets: 1 µs, 2 µs, 4 µs ... ~134 s, then +Inf.
BUCKETS: tuple[float, ...] = tuple(2.0**i / 1e6 for i in range(28))
_NB = len(BUCKETS)
_FOLD_AT = 2048


def _value(counter: itertools.count[int]) -> int:
    """Current value of an ``itertools.count`` without advancing it."""
    return int(repr(counter)[6:-1])


class Histogram:
    __slots__ = ("counts", "total", "n")

    def __init__(self) -> None:
        self.counts = [0] * (_NB + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        us = int(seconds * 1e6)
        i = us.bit_length() if us > 0 else 0
        self.counts[i if i < _NB else _NB] += 1
        self.total += seconds
        self.n += 1

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.total += other.total
        self.n += other.n

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket that holds quantile ``q`` (conservative)."""
        if not self.n:
            return None
        rank = q * self.n
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if c and seen >= rank:
                return BUCKETS[i] if i < _NB else float("inf")
        return float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.n,
            "sum_s": self.total,
            "p50_le_s": self.quantile(0.5),
            "p99_le_s": self.quantile(0.99),
            "buckets": [[b, c] for b, c in zip((*BUCKETS, float("inf")), self.counts) if c],
        }


class Stats:
    """Counters and latency histograms of one loop-affine object."""

    __slots__ = (
        "name",
        "_calls",
        "_ok",
        "_errors",
        "_owner_cancels",
        "_cancels",
        "_streams",
        "_batches",
        "_samples",
        "_returns",
        "_batch_sizes",
        "_lock",
        "_items_total",
        "admission",
        "run",
        "returned",
        "__weakref__",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls = itertools.count()
        self._ok = itertools.count()
        self._errors = itertools.count()
        self._owner_cancels = itertools.count()
        self._cancels = itertools.count()
        self._streams = itertools.count()
        self._batches = itertools.count()
        self._samples: deque[tuple[float, float, float]] = deque()
        self._returns: deque[float] = deque()
        self._batch_sizes: deque[int] = deque()
        self._lock = threading.Lock()
        self._items_total = 0
        self.admission = Histogram()
        self.run = Histogram()
        self.returned = Histogram()
        _registry.add(self)

    # -- events (any thread) ------------------------------------------------
    def submitted(self) -> None:
        next(self._calls)

    def finished(self, state: int, op: Any) -> None:
        if state == _OK:
            next(self._ok)
        elif state == _ERROR:
            next(self._errors)
        else:
            next(self._owner_cancels)
        if op.t_start:
            self._samples.append((op.t_submit, op.t_start, op.t_end))
            if len(self._samples) >= _FOLD_AT:
                self.fold()

    def cancelled(self) -> None:
        """The caller cancelled (counted in addition to how the call ended)."""
        next(self._cancels)

    def returned_after(self, seconds: float) -> None:
        self._returns.append(seconds)
        if len(self._returns) >= _FOLD_AT:
            self.fold()

    def stream_started(self) -> None:
        next(self._streams)

    def stream_batch(self, items: int) -> None:
        """The consumer took ``items`` buffered items after one wake-up."""
        next(self._batches)
        self._batch_sizes.append(items)
        if len(self._batch_sizes) >= _FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Move raw samples into the histograms."""
        with self._lock:
            samples, returns, sizes = self._samples, self._returns, self._batch_sizes
            adm, run, ret = self.admission.observe, self.run.observe, self.returned.observe
            for _ in range(len(samples)):
                t_submit, t_start, t_end = samples.popleft()
                adm(t_start - t_submit)
                if t_end:
                    run(t_end - t_start)
            for _ in range(len(returns)):
                ret(returns.popleft())
            for _ in range(len(sizes)):
                self._items_total += sizes.popleft()

    # -- reading ------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        self.fold()
        calls = _value(self._calls)
        ok, errors, owner_cancels = _value(self._ok), _value(self._errors), _value(self._owner_cancels)
        return {
            "calls": calls,
            "ok": ok,
            "errors": errors,
            "owner_cancellations": owner_cancels,
            "cancellations": _value(self._cancels),
            "in_flight": calls - ok - errors - owner_cancels,
            "streams": _value(self._streams),
            "stream_items": self._items_total,
            "stream_batches": _value(self._batches),
        }

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, **self.counters()}
        out["items_per_wakeup"] = (
            out["stream_items"] / out["stream_batches"] if out["stream_batches"] else None
        )
        with self._lock:
            out["admission"] = self.admission.as_dict()
            out["run"] = self.run.as_dict()
            out["return"] = self.returned.as_dict()
        return out


_registry: weakref.WeakSet[Stats] = weakref.WeakSet()


def all_stats() -> list[Stats]:
    return list(_registry)


def snapshot() -> dict[str, Any]:
    """Process-wide totals over every loop-affine object alive."""
    total: dict[str, Any] = {}
    adm, run, ret = Histogram(), Histogram(), Histogram()
    for stats in all_stats():
        for k, v in stats.counters().items():
            total[k] = total.get(k, 0) + v
        with stats._lock:
            adm.merge(stats.admission)
            run.merge(stats.run)
            ret.merge(stats.returned)
    total.setdefault("calls", 0)
    batches = total.get("stream_batches", 0)
    total["items_per_wakeup"] = total.get("stream_items", 0) / batches if batches else None
    total["admission"] = adm.as_dict()
    total["run"] = run.as_dict()
    total["return"] = ret.as_dict()
    return total
