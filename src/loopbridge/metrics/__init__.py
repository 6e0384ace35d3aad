"""Observability: what crosses between loops, how long it waits, and where it hangs.

* :func:`snapshot` - process-wide counters and latency histograms, per object
  name and per monitored loop; :func:`metrics_of` - one object's :class:`Metrics`.
* :func:`monitor_lag` - how late a loop runs callbacks that were due
  (:class:`LagMonitor`).
* :func:`dump_inflight` / :func:`format_inflight` / :func:`install_hang_dump` -
  every call and stream in flight, and who waits on whom;
  :func:`record_submission_sites` adds where each was submitted.
* :mod:`loopbridge.metrics.prometheus` - a ``prometheus_client`` collector for
  the same numbers (the only module here that needs ``prometheus_client``).

Recording is always on and costs a few counter bumps per call; reading folds
the raw samples.  See docs/metrics.md for every field.
"""

from __future__ import annotations

from .._diagnose import dump_inflight, format_inflight, install_hang_dump, record_submission_sites
from .._histogram import Histogram
from .._lag import LagMonitor, monitor_lag
from .._metrics import Metrics, Totals
from .._proxy import metrics_of
from .._public import publish as _publish
from .._snapshot import snapshot

__all__ = [
    "snapshot",
    "metrics_of",
    "Metrics",
    "Totals",
    "Histogram",
    "monitor_lag",
    "LagMonitor",
    "dump_inflight",
    "format_inflight",
    "install_hang_dump",
    "record_submission_sites",
]
_publish(__name__, globals(), __all__)
