"""Every order of two writers in the core's cross-thread handshakes, forced at named
points (see ``interleave.py``), never by timing.

Each test pauses one writer right after a step and runs the other writer to the
end meanwhile, then lets the first go on.  The outcome must be the same as if
they had run one after the other: one outcome, recorded once with its own
value, counted once, its caller woken; every posted item run exactly once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import loopbridge as lb
from loopbridge._calls import Call
from loopbridge._operation import Options
from loopbridge._outcome import CANCELLED, ERROR, OK
from loopbridge._ownership import Ownership
from loopbridge._ports import Port

from .conftest import tasks_on
from .interleave import BOUND, Interleaving, paused_at


class RecordingWaker:
    label = "test caller"
    thread_id = None

    def __init__(self) -> None:
        self.wakes = 0

    def wake(self, op: Any) -> None:
        self.wakes += 1


class NeverRuns:
    """A loop that never runs: what is scheduled on it is collected instead."""


def _port() -> tuple[Port, list[Any]]:
    scheduled: list[Any] = []
    return Port(NeverRuns(), scheduled.append, "test loop"), scheduled


def _first_paused(point: str, first: Callable[[], Any], then: Callable[[], Any]) -> list[Any]:
    """Run ``first`` until ``point``, then ``then`` to its end, then the rest of
    ``first``; returns ``first``'s result (or exception) in a list."""
    with Interleaving() as il, paused_at(il, point, first) as out:
        then()
    return out


def _call(port: Port | None = None) -> tuple[Call, RecordingWaker]:
    waker = RecordingWaker()
    opts = Options(Ownership(None, frozenset(), frozenset(), "Test object"), 16, 1.0, False)
    call = Call(lambda: None, (), {}, "Test.member()", opts, waker)  # type: ignore[arg-type]
    if port is not None:
        call.owner = port
        port.inflight[call] = None  # submitted
    return call, waker


def _counted(call: Call) -> dict[str, int]:
    s = call.opts.metrics.snapshot()
    return {k: s[k] for k in ("ok", "errors", "cancelled")}


def _assert_settled_once(call: Call, waker: RecordingWaker, outcome: Any, value: Any) -> None:
    assert call.outcome is outcome
    if isinstance(value, type):
        assert isinstance(call.value, value)
    else:
        assert call.value == value
    counted = _counted(call)
    assert sum(counted.values()) == 1, counted
    assert waker.wakes == 1
    assert not call.owner.inflight  # type: ignore[union-attr]


def test_settle_paused_after_its_latch_then_owner_death() -> None:
    port, _ = _port()
    call, waker = _call(port)
    _first_paused(
        "settle.latched",
        lambda: call.settle(OK, "result"),
        lambda: port.die(lb.OwnerLoopClosed("gone")),
    )  # runs to the end meanwhile
    _assert_settled_once(call, waker, OK, "result")


def test_owner_death_paused_after_marking_then_settle() -> None:
    port, _ = _port()
    call, waker = _call(port)
    _first_paused(
        "die.marked",
        lambda: port.die(lb.OwnerLoopClosed("gone")),
        lambda: call.settle(OK, "result"),
    )
    _assert_settled_once(call, waker, OK, "result")


def test_owner_death_paused_after_marking_wins_when_first_to_latch() -> None:
    port, _ = _port()
    call, waker = _call(port)
    _first_paused(
        "settle.latched",
        lambda: port.die(lb.OwnerLoopClosed("gone")),
        lambda: call.settle(OK, "result"),
    )  # too late: death holds the latch
    _assert_settled_once(call, waker, ERROR, lb.OwnerLoopClosed)


def test_result_paused_after_its_latch_then_a_cancel() -> None:
    port, _ = _port()
    call, waker = _call(port)

    def then() -> None:
        # What cancel_on_owner does for a call whose task has finished.
        call.settle(CANCELLED, asyncio.CancelledError("late"))

    _first_paused("settle.latched", lambda: call.settle(OK, "result"), then)
    _assert_settled_once(call, waker, OK, "result")


def test_cancel_paused_after_its_latch_then_the_result() -> None:
    port, _ = _port()
    call, waker = _call(port)
    cancel = asyncio.CancelledError("first")
    _first_paused(
        "settle.latched",
        lambda: call.settle(CANCELLED, cancel),
        lambda: call.settle(OK, "result"),
    )
    _assert_settled_once(call, waker, CANCELLED, asyncio.CancelledError)


def test_submit_paused_after_registering_then_owner_death() -> None:
    """Death fails the registered operation; submit then must not fail it again."""
    port, _ = _port()
    call, waker = _call()
    call.owner = port
    submitted = _first_paused(
        "submit.registered",
        lambda: port.submit(call, lambda op: None),
        lambda: port.die(lb.OwnerLoopClosed("gone")),
    )
    assert submitted == [None], "submit raised for an operation death had already failed"
    _assert_settled_once(call, waker, ERROR, lb.OwnerLoopClosed)


def test_owner_death_paused_after_marking_then_submit() -> None:
    port, _ = _port()
    call, waker = _call()
    call.owner = port

    def then() -> None:
        try:
            port.submit(call, lambda op: None)
        except lb.OwnerLoopClosed:
            pass
        else:
            raise AssertionError("submit to a dead port did not fail")

    _first_paused("die.marked", lambda: port.die(lb.OwnerLoopClosed("gone")), then)
    assert call.outcome.value == "pending" and waker.wakes == 0  # the caller got the raise
    assert not port.inflight


def _drain_all(port: Port, scheduled: list[Any]) -> None:
    while scheduled:
        scheduled.pop(0)()


def test_post_paused_after_appending_then_a_drain() -> None:
    port, scheduled = _port()
    ran: list[int] = []
    port.post(ran.append, 1)  # a drain is scheduled
    _first_paused(
        "post.appended", lambda: port.post(ran.append, 2), lambda: _drain_all(port, scheduled)
    )  # takes item 2 as well: it is in the inbox
    _drain_all(port, scheduled)
    assert ran == [1, 2]
    assert not port._inbox


def test_drain_paused_after_clearing_its_flag_then_a_post() -> None:
    port, scheduled = _port()
    ran: list[int] = []
    port.post(ran.append, 1)
    (drain,) = scheduled
    scheduled.clear()

    def then() -> None:
        port.post(ran.append, 2)  # sees the flag down: schedules a wake of its own
        assert len(scheduled) == 1

    _first_paused("drain.flag_cleared", drain, then)
    _drain_all(port, scheduled)
    assert ran == [1, 2]  # each exactly once: the second drain finds nothing left
    assert not port._inbox


# ------------------------------------------- stream end vs the consumer's empty check
class _Gated:
    """Yields 0, waits until its gate opens, yields 1 and ends (owner loop)."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def two(self) -> Any:
        yield 0
        await self.gate.wait()
        yield 1


def test_a_stream_ending_while_its_consumer_finds_the_buffer_empty_loses_no_item(
    asyncio_owner: lb.LoopThread,
) -> None:
    """The consumer finds its buffer empty and is held there; meanwhile the owner
    appends the last item and records the end.  The consumer must still get that
    item before the end (it used to see the end first, and lose the item)."""

    async def make() -> _Gated:
        return lb.adopt(_Gated())

    gated = asyncio_owner.run(make)
    first_taken, armed = threading.Event(), threading.Event()
    out: list[Any] = []

    async def consume() -> list[Any]:
        stream = lb.proxy(gated).two().__aiter__()
        got = [await stream.__anext__()]
        first_taken.set()
        assert armed.wait(BOUND)  # the main thread holds the next empty check
        async for item in stream:
            got.append(item)
        return got

    def consumer() -> None:
        try:
            out.append(asyncio.run(consume()))
        except BaseException as exc:
            out.append(exc)

    async def open_gate_and_finish() -> None:
        gated.gate.set()
        await asyncio.gather(*pump)  # it appends 1, then records the end

    with Interleaving() as il:
        t = threading.Thread(target=consumer, name="stream consumer")
        t.start()
        try:
            assert first_taken.wait(BOUND)
            il.hold("stream.buffer_empty")
            armed.set()
            il.reached("stream.buffer_empty")
            pump = tasks_on(asyncio_owner.loop)  # the stream's pump, waiting at the gate
            # The owner appends 1 and records the end while the consumer is held.
            asyncio_owner.run(open_gate_and_finish)
        finally:
            il.release("stream.buffer_empty")
            t.join(BOUND)
    assert not t.is_alive()
    assert out == [[0, 1]]
