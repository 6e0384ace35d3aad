"""Owner-loop lag: how late a loop runs a callback that was due.

A cross-loop call waits in its owner's ready queue until the owner loop gets to
it, so a loop busy with CPU work (or blocked in a synchronous call) delays every
call that reaches it.  The admission histogram shows the effect per call; the
lag monitor shows the cause per loop, even when no call is in flight: a timer
on the loop asks to run every ``interval`` seconds and records how late it ran.

The timer handle is all the monitor adds to the loop: one callback per interval,
about a microsecond each.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any

from ._construction import NoPublicConstructor
from ._histogram import Histogram
from ._labels import loop_label
from ._ports import get_running_loop

__all__ = ["LagMonitor", "monitor_lag", "lag_snapshots", "DEFAULT_INTERVAL"]

#: Seconds between two lag probes.
DEFAULT_INTERVAL = 0.05

_perf = time.perf_counter


class LagMonitor(metaclass=NoPublicConstructor):
    """Measures the scheduling lag of one asyncio loop (uvloop included).

    Created by :func:`monitor_lag`.  Readable from any thread: :attr:`max_s`,
    :attr:`last_s`, :attr:`samples`, :meth:`snapshot` (with a log2 histogram and
    its p50/p99 bounds).  Stop it with :meth:`stop` or by using it as a context
    manager.
    """

    _lb_factory = "loopbridge.metrics.monitor_lag()"

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float, name: str) -> None:
        self.loop = loop
        self.interval = interval
        self.name = name
        self._hist = Histogram()
        self._last = 0.0
        self._lock = threading.Lock()
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._stopped = False

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LagMonitor {self.name} every {self.interval} s, {state}>"

    # -- on the loop --------------------------------------------------------
    def _arm(self) -> None:
        if self._stopped:
            return
        self._due = _perf() + self.interval
        self._handle = self.loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        # Timers may fire up to the clock resolution early: that is no lag.
        lag = max(0.0, _perf() - self._due)
        with self._lock:
            self._hist.observe(lag)
            self._last = lag
        self._arm()

    def _cancel(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()

    # -- any thread ---------------------------------------------------------
    @property
    def running(self) -> bool:
        return not self._stopped and not self.loop.is_closed()

    def stop(self) -> None:
        """Stop probing (idempotent, any thread).  The numbers stay readable."""
        if self._stopped:
            return
        self._stopped = True
        _monitors.discard(self)
        if get_running_loop() is self.loop:
            self._cancel()
            return
        try:
            self.loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # closed loop: its timers died with it
            pass

    @property
    def max_s(self) -> float:
        """Largest lag seen (seconds); 0.0 before the first probe."""
        with self._lock:
            return self._hist.max

    @property
    def last_s(self) -> float:
        """Lag of the most recent probe (seconds)."""
        return self._last

    @property
    def samples(self) -> int:
        with self._lock:
            return self._hist.n

    def histogram(self) -> Histogram:
        """A copy of the lag histogram."""
        with self._lock:
            return self._hist.copy()

    def snapshot(self) -> dict[str, Any]:
        hist = self.histogram()
        return {
            "loop": self.name,
            "interval_s": self.interval,
            "running": self.running,
            "last_s": self._last,
            "lag": hist.as_dict(),
        }

    def __enter__(self) -> LagMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_monitors: weakref.WeakSet[LagMonitor] = weakref.WeakSet()


def monitor_lag(
    loop: asyncio.AbstractEventLoop | None = None,
    interval: float = DEFAULT_INTERVAL,
    *,
    name: str | None = None,
) -> LagMonitor:
    """Start measuring the scheduling lag of ``loop`` (default: the running loop).

    Callable from any thread; the probe starts once the loop runs.  ``name``
    labels the loop in :func:`loopbridge.metrics.snapshot` and Prometheus
    (default: ``"<kind> loop 0x<id>"``).  A running monitor is reported until it
    is stopped or its loop closes; keep the handle to read it directly.
    """
    if loop is None:
        loop = get_running_loop()
        if loop is None:
            raise RuntimeError("monitor_lag() needs a loop: pass one, or call it on a running loop")
    if not isinstance(loop, asyncio.AbstractEventLoop):
        raise TypeError(f"monitor_lag() needs an asyncio event loop, not {type(loop).__qualname__}")
    if not interval > 0:
        raise ValueError(f"interval must be positive, not {interval!r}")
    if loop.is_closed():
        raise ValueError(f"cannot monitor {loop!r}: it is closed")
    if name is None:
        name = loop_label(loop)
    mon = LagMonitor._create(loop, float(interval), name)
    _monitors.add(mon)
    if get_running_loop() is loop:
        mon._arm()
    else:
        loop.call_soon_threadsafe(mon._arm)
    return mon


def overdue_s(loop: object) -> float:
    """How long the lag probe of ``loop`` has been overdue (seconds; 0.0 when it is
    not, or no monitor probes that loop): the loop has not run its timers for that
    long.  Read by a caller that gave up waiting, to say why (any thread)."""
    now = _perf()
    worst = 0.0
    for mon in list(_monitors):
        if mon.loop is loop and mon._handle is not None and not mon._stopped:
            worst = max(worst, now - mon._due)
    return worst


def lag_snapshots() -> list[dict[str, Any]]:
    """Snapshots of every monitor that is still probing, by name."""
    return sorted(
        (m.snapshot() for m in list(_monitors) if m.running), key=lambda s: str(s["loop"])
    )
