"""The process-wide snapshot: every object's totals and every monitored loop's lag.

It sits above both :mod:`loopbridge._metrics` and :mod:`loopbridge._lag`, so
neither imports the other.
"""

from __future__ import annotations

from typing import Any

from ._lag import lag_snapshots
from ._metrics import Totals, totals_by_name

__all__ = ["snapshot"]


def snapshot() -> dict[str, Any]:
    """Process-wide numbers: totals, per object name, and per monitored loop.

    The totals' fields are those of :meth:`Metrics.snapshot`, plus ``"objects"``
    (``{name: fields}``; objects of the same class share a name, and objects
    that were garbage collected stay counted under theirs) and ``"loops"`` (one
    entry per running :func:`~loopbridge.metrics.monitor_lag` monitor).
    """
    by_name = totals_by_name()
    total = Totals()
    for t in by_name.values():
        total.add(t)
    return {
        **total.as_dict(),
        "objects": {name: t.as_dict() for name, t in by_name.items()},
        "loops": lag_snapshots(),
    }
