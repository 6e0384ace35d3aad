"""The owner-loop lag monitor tells a loop blocked by CPU work from an idle one."""

from __future__ import annotations

import asyncio
import time

import pytest
from metrics_support import apoll_until, poll_until

import loopbridge as lb
from loopbridge.metrics import LagMonitor, monitor_lag, snapshot


async def _round_trip() -> None:
    pass


def _wait_for_samples(mon: LagMonitor, n: int) -> None:
    poll_until(lambda: mon.samples >= n, f"{n} lag samples")


def test_blocked_loop_shows_lag_and_idle_loop_does_not(owner: lb.LoopThread) -> None:
    with monitor_lag(owner.loop, interval=0.01, name="lag-under-test") as mon:
        _wait_for_samples(mon, 10)
        idle_max = mon.max_s
        idle_samples = mon.samples
        assert idle_samples >= 10

        # CPU-bound work in a callback: the loop cannot run its timer meanwhile.
        owner.loop.call_soon_threadsafe(time.sleep, 0.2)
        _wait_for_samples(mon, idle_samples + 5)
        busy_max = mon.max_s
        assert busy_max >= 0.15, busy_max
        assert idle_max < busy_max  # the idle loop showed less (a ratio, not a bound)
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
    # stop() cancels the probe timer on the loop; once the loop has run that,
    # no timer is left to probe again.
    owner.run(_round_trip)
    assert mon._handle is None


def test_monitor_the_running_loop_and_stop_on_it() -> None:
    def block_this_loop(seconds: float) -> None:
        time.sleep(seconds)  # CPU-bound work on the monitored loop, in the test's story

    async def main() -> tuple[float, int]:
        mon = monitor_lag(interval=0.005)
        assert mon.loop is asyncio.get_running_loop()
        await apoll_until(lambda: mon.samples >= 2, "two probes")
        block_this_loop(0.1)
        before = mon.samples
        await apoll_until(lambda: mon.samples > before, "the probe after the block")
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
