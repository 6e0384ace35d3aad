"""Waiting for the code under test, by polling with a deadline (never a bare sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEADLINE_S = 30.0


def poll_until(condition: Callable[[], object], what: str) -> None:
    """Block this thread until ``condition()`` is true; fail after the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)  # the poll interval


async def apoll_until(condition: Callable[[], object], what: str) -> None:
    """:func:`poll_until` for a coroutine: this loop keeps running meanwhile."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.002)  # the poll interval
