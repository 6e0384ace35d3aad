"""loopbridge's Prometheus series on the server's ``/metrics``, and owner-loop lag.

:func:`export_metrics` is called by every server that starts with metrics on.
It keeps two invariants however many servers start, stop and restart:

* **One collector per process**, in ``prometheus_client``'s default registry:
  the one vLLM's ``/metrics`` serves from a single API-server process. A second
  registration would raise (duplicated series); a collector the user registered
  by hand counts as ours.
* **One lag monitor per owner loop**, labelled with the model and the owner
  thread's name, unique in the process, so that an operator can tell engines
  apart. A monitor whose loop has closed is dropped (it no longer reports).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

from loopbridge.metrics import LagMonitor, monitor_lag

__all__ = ["export_metrics"]

_log = logging.getLogger("loopbridge_vllm.server")

_lock = threading.Lock()
_collector_registered = False
# Live monitors by owner loop id (ids are only compared while the loop is open).
_monitors: dict[int, LagMonitor] = {}


def export_metrics(owner: asyncio.AbstractEventLoop, label: str) -> LagMonitor | None:
    """Register the collector (once) and monitor ``owner``'s lag (once per loop).

    Returns the owner loop's monitor, or ``None`` without ``prometheus_client``.
    """
    with _lock:
        if not _register_collector():
            return None
        for key, mon in list(_monitors.items()):
            if not mon.running:
                del _monitors[key]
        known = _monitors.get(id(owner))
        if known is not None and known.loop is owner:
            return known
        taken = {m.name for m in _monitors.values()}
        name, n = label, 1
        while name in taken:
            n += 1
            name = f"{label} #{n}"
        mon = monitor_lag(owner, name=name)
        _monitors[id(owner)] = mon
        return mon


def _register_collector() -> bool:
    global _collector_registered
    if _collector_registered:
        return True
    try:
        from prometheus_client import REGISTRY

        from loopbridge.metrics.prometheus import LoopbridgeCollector
    except ImportError:
        _log.info("prometheus_client is not installed: loopbridge's series are not exported")
        return False
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # vLLM then serves a fresh registry fed from files of its own processes.
        _log.warning(
            "PROMETHEUS_MULTIPROC_DIR is set: /metrics serves vLLM's multiprocess "
            "registry, which loopbridge's series are not part of"
        )
    try:
        REGISTRY.register(LoopbridgeCollector())
    except ValueError:  # already registered by hand: same series
        pass
    _collector_registered = True
    return True
