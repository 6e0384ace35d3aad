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

import pytest

pytest.importorskip("vllm")

from loopbridge_vllm.bench._stack import BusyLoad, _busy

#: A refit as soon as the load starts, and no time paused beyond the calls.
_REFIT_AT_ONCE = BusyLoad(refit_every_s=1e-6, refit_pause_s=0.0)


class _Engine:
    """pause_generation and resume_generation, each held inside until released."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.in_pause = asyncio.Event()
        self.in_resume = asyncio.Event()
        self.release_pause = asyncio.Event()
        self.release_resume = asyncio.Event()

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.calls.append("pause")
        self.in_pause.set()
        await self.release_pause.wait()
        self.calls.append("paused")

    async def resume_generation(self) -> None:
        self.calls.append("resume")
        self.in_resume.set()
        await self.release_resume.wait()
        self.calls.append("resumed")


def _counters() -> dict[str, int]:
    return {"slices": 0, "refits": 0, "refit_pause_errors": 0}


def test_a_load_stopped_during_the_pause_call_still_resumes_the_engine() -> None:
    async def main() -> list[str]:
        engine = _Engine()
        engine.release_resume.set()
        task = asyncio.ensure_future(_busy(engine, _REFIT_AT_ONCE, _counters()))
        await engine.in_pause.wait()
        task.cancel()  # the load stops while pause_generation is under way
        with pytest.raises(asyncio.CancelledError):
            await task
        return engine.calls

    assert asyncio.run(main()) == ["pause", "resume", "resumed"]


def test_a_load_stopped_during_the_resume_waits_for_the_resume_to_end() -> None:
    async def main() -> list[str]:
        engine = _Engine()
        engine.release_pause.set()
        task = asyncio.ensure_future(_busy(engine, _REFIT_AT_ONCE, _counters()))
        await engine.in_resume.wait()
        task.cancel()  # the load stops while resume_generation is under way
        await asyncio.sleep(0)  # one loop turn (no time): the cancel reaches the task
        assert not task.done()
        engine.release_resume.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return engine.calls

    assert asyncio.run(main()) == ["pause", "paused", "resume", "resumed"]
