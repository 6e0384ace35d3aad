"""Under ``raise``, a cross-loop wake fails the waiter, never the loop that woke it.

The pattern of an engine awaited from the wrong loop: its output handler (loop A,
serving many requests) wakes a waiter that a caller parked on loop B. Raising in
the handler would kill the engine and leave the caller hanging; the sanitizer
reports there without raising, skips the wake, and fails the caller's wait.
A wake from a plain thread is the caller's own misuse: it still raises there.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from sanitizer_support import LoopInThread

from loopbridge.sanitizer import SanitizerError, sanitize


def test_a_producer_loop_goes_on_and_the_foreign_waiter_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        caplog.at_level(logging.ERROR, logger="loopbridge.sanitizer"),
        sanitize("raise") as block,
        LoopInThread("engine-loop") as a,
        LoopInThread("caller-loop") as b,
    ):
        foreign: asyncio.Event = b.call(asyncio.Event)
        waiting = b.submit(foreign.wait())
        b.call(lambda: None)  # parked: its waiter is bound to loop B

        async def handler() -> str:
            # The producer's own loop: the wake it makes for B must not raise here,
            # and its own work on A goes on afterwards.
            foreign.set()
            mine = asyncio.Event()
            asyncio.get_running_loop().call_soon(mine.set)
            await mine.wait()
            return "handler went on"

        assert a.run(handler()) == "handler went on"
        with pytest.raises(SanitizerError, match=r"Event.set\(\) called from the wrong loop"):
            waiting.result(5)
        assert len(block.reports) == 1 and block.reports[0].call_site.thread == "engine-loop"
        assert not b.call(foreign.is_set)  # the wake was not done
    assert any("each waiter fails with it" in r.getMessage() for r in caplog.records)


def test_a_queue_put_from_another_loop_fails_the_getter() -> None:
    with sanitize("raise"), LoopInThread("engine-loop") as a, LoopInThread("caller-loop") as b:
        queue: asyncio.Queue[int] = b.call(asyncio.Queue)
        getting = b.submit(queue.get())
        b.call(lambda: None)
        a.call(lambda: queue.put_nowait(1))  # not raised on the producer's loop
        with pytest.raises(SanitizerError, match="put_nowait"):
            getting.result(5)


def test_a_wake_from_a_plain_thread_still_raises_in_that_thread() -> None:
    with sanitize("raise"), LoopInThread("caller-loop") as b:
        ev: asyncio.Event = b.call(asyncio.Event)
        waiting = b.submit(ev.wait())
        b.call(lambda: None)
        with pytest.raises(SanitizerError, match="wrong thread"):
            ev.set()
        b.loop.call_soon_threadsafe(ev.set)
        assert waiting.result(5) is True
