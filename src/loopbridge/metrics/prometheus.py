"""Prometheus export of loopbridge's metrics (needs ``prometheus_client``).

::

    from prometheus_client import REGISTRY
    from loopbridge.metrics.prometheus import LoopbridgeCollector

    REGISTRY.register(LoopbridgeCollector())

The collector keeps no state of its own: each scrape reads the same numbers as
:func:`loopbridge.metrics.snapshot`.  Series are labelled by object *name* (its
class, e.g. ``object="AsyncLLM object"``), not by instance, so the number of
series stays bounded however many objects come and go; objects that were
garbage collected stay counted, so counters never go down.  Loops appear once
:func:`loopbridge.metrics.monitor_lag` watches them, labelled ``loop=<monitor name>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from .._histogram import Histogram
from .._lag import LagMonitor, _monitors
from .._metrics import Totals, totals_by_name

__all__ = ["LoopbridgeCollector"]


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    out = [
        (repr(bound) if bound != float("inf") else "+Inf", float(n))
        for bound, n in hist.cumulative()
    ]
    return out


class LoopbridgeCollector:
    """A ``prometheus_client`` custom collector for calls, streams and loop lag.

    Register it once per registry.  ``namespace`` prefixes every metric name.
    """

    def __init__(self, namespace: str = "loopbridge") -> None:
        if not namespace.replace("_", "").isalnum():
            raise ValueError(
                f"namespace must be letters, digits and underscores, not {namespace!r}"
            )
        self.namespace = namespace

    def describe(self) -> Iterable[Metric]:
        # Names only, so registering does not take a scrape.
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        by_name = totals_by_name()
        monitors = sorted((m for m in list(_monitors) if m.running), key=lambda m: m.name)
        return list(self._families(by_name, monitors))

    def _families(
        self, by_name: dict[str, Totals] | None = None, monitors: list[LagMonitor] | None = None
    ) -> Iterator[Metric]:
        yield from _object_families(self.namespace, by_name or {})
        yield from _lag_families(self.namespace, monitors or [])


def _object_families(ns: str, objs: dict[str, Totals]) -> Iterator[Metric]:
    """The calls' and streams' series, by object."""
    calls = CounterMetricFamily(f"{ns}_calls", "Cross-loop calls submitted.", labels=["object"])
    ended = CounterMetricFamily(
        f"{ns}_calls_ended", "Cross-loop calls ended, by outcome.", labels=["object", "outcome"]
    )
    caller_cancels = CounterMetricFamily(
        f"{ns}_call_caller_cancellations",
        "Calls whose caller was cancelled while waiting.",
        labels=["object"],
    )
    in_flight = GaugeMetricFamily(
        f"{ns}_calls_in_flight", "Cross-loop calls submitted and not ended.", labels=["object"]
    )
    streams = CounterMetricFamily(f"{ns}_streams", "Cross-loop streams opened.", labels=["object"])
    streams_ended = CounterMetricFamily(
        f"{ns}_streams_ended",
        "Cross-loop streams ended, by outcome.",
        labels=["object", "outcome"],
    )
    streams_open = GaugeMetricFamily(
        f"{ns}_streams_open", "Cross-loop streams opened and not ended.", labels=["object"]
    )
    items = CounterMetricFamily(
        f"{ns}_stream_items", "Stream items delivered to consumers.", labels=["object"]
    )
    wakeups = CounterMetricFamily(
        f"{ns}_stream_wakeups", "Consumer wake-ups that delivered items.", labels=["object"]
    )
    unread = CounterMetricFamily(
        f"{ns}_stream_items_unread",
        "Stream items read ahead from the source and never delivered (the consumer left).",
        labels=["object"],
    )
    hists = _histogram_families(ns)
    for name, t in objs.items():
        c, s = t.calls, t.streams
        calls.add_metric([name], c["submitted"])
        ended.add_metric([name, "ok"], c["ok"])
        ended.add_metric([name, "error"], c["errors"])
        ended.add_metric([name, "cancelled"], c["cancelled"])
        caller_cancels.add_metric([name], c["caller_cancels"])
        in_flight.add_metric([name], t.calls_in_flight)
        streams.add_metric([name], s["opened"])
        streams_ended.add_metric([name, "completed"], s["completed"])
        streams_ended.add_metric([name, "error"], s["errors"])
        streams_ended.add_metric([name, "cancelled"], s["cancelled"])
        streams_open.add_metric([name], t.streams_open)
        items.add_metric([name], s["items"])
        wakeups.add_metric([name], s["wakeups"])
        unread.add_metric([name], s["unread"])
        for key, hist in (
            ("admission", t.admission),
            ("run", t.run),
            ("return", t.returned),
            ("batch", t.batch_size),
        ):
            hists[key].add_metric([name], _buckets(hist), hist.total)
    yield from (calls, ended, caller_cancels, in_flight, streams, streams_ended, streams_open)
    yield from (items, wakeups, unread, *hists.values())


def _histogram_families(ns: str) -> dict[str, HistogramMetricFamily]:
    """The calls' and streams' histograms, by what they time."""
    return {
        "admission": HistogramMetricFamily(
            f"{ns}_admission_seconds",
            "Submitted on the caller until started on the owner loop (calls and streams).",
            labels=["object"],
        ),
        "run": HistogramMetricFamily(
            f"{ns}_run_seconds", "Calls running on the owner loop.", labels=["object"]
        ),
        "return": HistogramMetricFamily(
            f"{ns}_return_seconds",
            "Call finished on the owner until the caller resumed.",
            labels=["object"],
        ),
        "batch": HistogramMetricFamily(
            f"{ns}_stream_items_per_wakeup",
            "Items a stream consumer took per wake-up.",
            labels=["object"],
        ),
    }


def _lag_families(ns: str, monitors: list[LagMonitor]) -> Iterator[Metric]:
    """The monitored loops' scheduling lag."""
    lag = HistogramMetricFamily(
        f"{ns}_loop_lag_seconds",
        "How late the loop ran a timer callback that was due (scheduling lag).",
        labels=["loop"],
    )
    lag_max = GaugeMetricFamily(
        f"{ns}_loop_lag_max_seconds", "Largest scheduling lag seen.", labels=["loop"]
    )
    for mon in monitors:
        hist = mon.histogram()
        lag.add_metric([mon.name], _buckets(hist), hist.total)
        lag_max.add_metric([mon.name], hist.max)
    yield lag
    yield lag_max
