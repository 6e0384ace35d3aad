"""The owner-loop lag monitor tells a loop blocked by CPU work from an idle one."""

from __future__ import annotations

import asyncio
import time

import pytest

import loopbridge as lb
from loopbridge.metrics import monitor_lag, snapshot


def _wait_for_samples(mon: object, n: int) -> None:
    deadline = time.monotonic() + 5
    while mon.samples < n and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.005)


def test_blocked_loop_shows_lag_and_idle_loop_does_not(owner: lb.LoopThread) -> None:
    with monitor_lag(owner.loop, interval=0.01, name="lag-under-test") as mon:
        _wait_for_samples(mon, 10)
        idle_max = mon.max_s
        idle_samples = mon.samples
        assert idle_samples >= 10
        assert idle_max < 0.05, idle_max

        # CPU-bound work in a callback: the loop cannot run its timer meanwhile.
        owner.loop.call_soon_threadsafe(time.sleep, 0.2)
        _wait_for_samples(mon, idle_samples + 5)
        busy_max = mon.max_s
        assert busy_max >= 0.15, busy_max
        hist = mon.histogram()
        assert sum(c for b, c in zip(hist.bounds, hist.counts) if b > 0.1) + hist.counts[-1] >= 1
        assert hist.quantile(1.0) is not None and hist.quantile(1.0) >= 0.15  # type: ignore[operator]

        loops = [s for s in snapshot()["loops"] if s["loop"] == "lag-under-test"]
        assert len(loops) == 1
        assert loops[0]["running"] is True
        assert loops[0]["lag"]["max_s"] >= 0.15
        assert loops[0]["lag"]["count"] >= idle_samples + 5
    assert not mon.running
    assert not [s for s in snapshot()["loops"] if s["loop"] == "lag-under-test"]
    n = mon.samples
    time.sleep(0.05)
    assert mon.samples == n  # stopped: no more probes


def test_monitor_the_running_loop_and_stop_on_it() -> None:
    async def main() -> tuple[float, int]:
        mon = monitor_lag(interval=0.005)
        assert mon.loop is asyncio.get_running_loop()
        await asyncio.sleep(0.05)
        time.sleep(0.1)  # this loop, blocked
        await asyncio.sleep(0.03)
        mon.stop()
        mon.stop()  # idempotent
        return mon.max_s, mon.samples

    max_s, samples = asyncio.run(main())
    assert samples >= 3
    assert max_s >= 0.07


def test_bad_arguments_are_typed_errors() -> None:
    with pytest.raises(RuntimeError, match="needs a loop"):
        monitor_lag()
    with pytest.raises(TypeError, match="asyncio event loop"):
        monitor_lag(object())  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    with pytest.raises(ValueError, match="positive"):
        monitor_lag(loop, interval=0)
    loop.close()
    with pytest.raises(ValueError, match="closed"):
        monitor_lag(loop)


def test_monitor_of_a_loop_that_closes_is_no_longer_reported() -> None:
    t = lb.LoopThread(name="closing-owner").start()
    mon = monitor_lag(t.loop, interval=0.01, name="closing-loop")
    _wait_for_samples(mon, 2)
    assert [s for s in snapshot()["loops"] if s["loop"] == "closing-loop"]
    t.stop()
    assert not mon.running
    assert not [s for s in snapshot()["loops"] if s["loop"] == "closing-loop"]
    mon.stop()  # after the loop closed: no error
    assert mon.samples >= 2
