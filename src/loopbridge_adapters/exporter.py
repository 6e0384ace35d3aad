"""loopbridge's Prometheus series on a server's ``/metrics``, and owner-loop lag.

:func:`export_metrics` is called by every server that starts with metrics on and
serves ``prometheus_client``'s default registry (vLLM's ``/metrics`` from a single
API-server process, :func:`metrics_app` without ``multiprocess``);
:func:`monitor_owner` alone by one that serves its own registry
(:func:`metrics_app` with ``multiprocess``: SGLang's ``--enable-metrics``). They keep
two invariants however many servers start, stop and restart:

* **One collector per process** in the default registry. A second registration
  would raise (duplicated series); a collector the user registered by hand counts
  as ours. A registry :func:`metrics_app` builds has its own.
* **One lag monitor per owner loop**, labelled with the model and the owner
  thread's name, unique in the process, so that an operator can tell engines
  apart. A monitor whose loop has closed is dropped (it no longer reports).

Imports no engine; ``prometheus_client`` only when a server asks for metrics.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from loopbridge.metrics import LagMonitor, monitor_lag

__all__ = ["MetricsFirst", "export_metrics", "metrics_app", "monitor_owner"]

_log = logging.getLogger(__name__)

_lock = threading.Lock()
_collector_registered = False
# Live monitors by owner loop id (ids are only compared while the loop is open).
_monitors: dict[int, LagMonitor] = {}

ASGIApp = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[MutableMapping[str, Any]]],
        Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ],
    Awaitable[None],
]


def export_metrics(owner: asyncio.AbstractEventLoop, label: str) -> LagMonitor | None:
    """Register the collector in the default registry (once) and :func:`monitor_owner`.

    Returns the owner loop's monitor, or ``None`` without ``prometheus_client``.
    """
    with _lock:
        if not _register_collector():
            return None
    return monitor_owner(owner, label)


def monitor_owner(owner: asyncio.AbstractEventLoop, label: str) -> LagMonitor:
    """Monitor ``owner``'s lag (once per loop), as ``label`` (``#2``... if taken)."""
    with _lock:
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


def metrics_app(*, multiprocess: bool) -> ASGIApp | None:
    """An ASGI app for ``/metrics`` with loopbridge's series; ``None`` without
    ``prometheus_client``.

    Without ``multiprocess`` it serves the default registry (call :func:`export_metrics`
    too). With it, a registry of its own: the series in ``prometheus_client``'s
    multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, where an engine that runs in
    several processes keeps its own, as SGLang's ``/metrics`` serves them) and
    loopbridge's collector (call :func:`monitor_owner` for the lag).
    """
    try:
        from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app
        from prometheus_client.multiprocess import MultiProcessCollector

        from loopbridge.metrics.prometheus import LoopbridgeCollector
    except ImportError:
        _log.info("prometheus_client is not installed: loopbridge's series are not exported")
        return None
    if not multiprocess:
        app: ASGIApp = make_asgi_app(REGISTRY)
        return app
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # untyped upstream
    registry.register(LoopbridgeCollector())
    app = make_asgi_app(registry)
    return app


class MetricsFirst:
    """ASGI middleware: ``/metrics`` (and the paths below it) from ``metrics``,
    everything else to ``app``, which never sees them (so an engine's own
    ``/metrics``, when it has one, is served by ``metrics`` instead)."""

    def __init__(self, app: ASGIApp, metrics: ASGIApp) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == "/metrics" or path.startswith("/metrics/"):
            await self.metrics(scope, receive, send)
        else:
            await self.app(scope, receive, send)


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
            "PROMETHEUS_MULTIPROC_DIR is set: a /metrics that serves the multiprocess "
            "registry alone (vLLM's does) carries none of loopbridge's series"
        )
    try:
        REGISTRY.register(LoopbridgeCollector())
    except ValueError:  # already registered by hand: same series
        pass
    _collector_registered = True
    return True
