"""The benchmark's busy load never leaves the engine paused for the next job.

Its refit cycle pauses generation, then resumes it; the load is stopped (its task
cancelled) after each job. A cancel that lands during the pause call, or during
the resume, must still end with the engine resumed: otherwise the next job starts
on a paused engine and waits for the next cycle (one quiet run lost 990 ms on 16
requests that way). The engine here is a stand-in whose calls block on events, so
each cancel lands exactly inside the call it is meant to interrupt.
"""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from loopbridge_bench.vllm._stack import BUSY_WORK, BusyLoad, _busy

#: A refit as soon as the load starts, and no time paused beyond the calls.
_REFIT_AT_ONCE = BusyLoad(refit_every_s=1e-6, refit_pause_s=0.0)


class _Engine:
    """pause_generation and resume_generation; the ``held`` one blocks inside until
    ``release`` is set."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.calls: list[str] = []
        self.inside = asyncio.Event()
        self.release = asyncio.Event()

    async def _call(self, name: str, done: str) -> None:
        self.calls.append(name)
        if name == self.held:
            self.inside.set()
            await self.release.wait()
        self.calls.append(done)

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        await self._call("pause", "paused")

    async def resume_generation(self) -> None:
        await self._call("resume", "resumed")


@pytest.mark.parametrize(
    ("held", "calls"),
    [
        ("pause", ["pause", "resume", "resumed"]),  # the pause call is cut off, then resumed
        ("resume", ["pause", "paused", "resume", "resumed"]),  # the resume runs to its end
    ],
)
def test_a_load_stopped_inside_a_refit_call_ends_with_the_engine_resumed(
    held: str, calls: list[str]
) -> None:
    async def main() -> list[str]:
        engine = _Engine(held)
        counters = {"slices": 0, "refits": 0, "refit_pause_errors": 0}
        task = asyncio.ensure_future(_busy(engine, _REFIT_AT_ONCE, counters))
        await engine.inside.wait()
        task.cancel()  # the load stops while the held call is under way
        await asyncio.sleep(0)  # one loop turn (no time): the cancel reaches the task
        if held == "resume":
            assert not task.done()  # it waits for the resume it is in
        engine.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return engine.calls

    assert asyncio.run(main()) == calls


def _ran_during_slice(work: str) -> bool:
    """Whether another Python thread ran while one slice of ``work`` blocked this one.

    The switch interval is set far beyond the slice, so a holder of the GIL is never
    made to drop it: the other thread, released just before the slice, can run only
    if the slice itself lets go of the GIL.
    """
    ran = threading.Event()
    gate = threading.Lock()
    gate.acquire()

    def other() -> None:
        with gate:
            ran.set()

    thread = threading.Thread(target=other)
    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        thread.start()
        gate.release()  # the thread now waits for the GIL only
        BUSY_WORK[work].run(0.05)
        during = ran.is_set()
    finally:
        sys.setswitchinterval(old)
        thread.join()
    return during


@pytest.mark.parametrize(
    ("work", "releases"), [("python", False), ("native", True), ("wait", True)]
)
def test_a_slice_holds_the_gil_only_for_pure_python(work: str, releases: bool) -> None:
    """``--busy-work``: ``python`` keeps every other thread out for its whole slice;
    ``native`` and ``wait`` block only their own loop."""
    assert _ran_during_slice(work) is releases


def test_an_unknown_busy_work_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="use one of python, native, wait"):
        BusyLoad(slice_s=0.004, period_s=0.01, work="torch")
