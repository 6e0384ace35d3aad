"""Hang diagnosis: a call stuck on its owner and a parked stream, both sides named."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import threading
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from metrics_support import apoll_until, poll_until

import loopbridge as lb
from loopbridge.metrics import (
    dump_inflight,
    format_inflight,
    install_hang_dump,
    record_submission_sites,
)

HERE = os.path.abspath(__file__)


def _line(marker: str) -> int:
    with open(HERE) as f:
        for n, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return n
    raise AssertionError(marker)


@lb.loop_affine
class Stuck:
    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def wait_forever(self) -> None:
        await self.never.wait()  # owner-call-here

    async def one_then_nothing(self) -> AsyncGenerator[int, None]:
        yield 1
        await self.never.wait()  # owner-stream-here
        yield 2


async def _make() -> Stuck:
    return Stuck()


def _mine(entries: list[dict[str, Any]], owner: lb.LoopThread) -> list[dict[str, Any]]:
    label = f"loop 0x{id(owner.loop):x}"
    return [e for e in entries if str(e["owner"]).endswith(label)]


def _running(entries: list[dict[str, Any]]) -> bool:
    """Every entry has started on the owner, which is suspended inside it."""
    return bool(entries) and all(e["started"] and e["owner_at"] for e in entries)


def test_dump_names_both_sides_durations_and_sites(owner: lb.LoopThread, sites: None) -> None:
    engine = owner.run(_make)
    p = lb.proxy(engine)
    ready = threading.Event()
    done = threading.Event()
    caller_loop: list[asyncio.AbstractEventLoop] = []

    async def caller() -> None:
        caller_loop.append(asyncio.get_running_loop())

        async def stuck_call() -> None:
            await p.wait_forever()  # caller-call-here

        call = asyncio.ensure_future(stuck_call())
        stream = p.one_then_nothing()  # caller-stream-here
        assert await stream.__anext__() == 1
        nxt = asyncio.ensure_future(stream.__anext__())
        ready.set()
        await asyncio.to_thread(done.wait)
        call.cancel()
        nxt.cancel()
        await asyncio.gather(call, nxt, return_exceptions=True)
        await stream.aclose()

    def both_waiting() -> bool:
        # The call runs on the owner and the consumer is parked on the stream.
        found = {e["kind"]: e for e in _mine(dump_inflight(), owner)}
        return (
            set(found) == {"call", "stream"}
            and found["call"]["started"]
            and found["call"]["owner_at"] is not None
            and found["stream"]["consumer_parked"]
            and found["stream"]["owner_at"] is not None
        )

    thread = threading.Thread(target=asyncio.run, args=(caller(),), name="caller-thread")
    thread.start()
    try:
        assert ready.wait(30)
        poll_until(both_waiting, "the call runs and the consumer is parked")
        entries = _mine(dump_inflight(), owner)
        text = format_inflight(entries)
    finally:
        done.set()
        thread.join(30)
    assert not thread.is_alive()

    by_kind = {e["kind"]: e for e in entries}
    assert set(by_kind) == {"call", "stream"}, entries
    call, stream = by_kind["call"], by_kind["stream"]
    caller_label = f"loop 0x{id(caller_loop[0]):x}"
    for e in (call, stream):
        assert e["caller"].endswith(caller_label)
        assert e["submitted_from_thread"] == "caller-thread"
        assert e["owner_thread"] == owner.name
        assert e["waiting_s"] > 0
        assert e["started"] is True
    assert call["what"] == "Stuck.wait_forever()"
    assert 0 < call["running_s"] <= call["waiting_s"]
    assert call["submitted_at"].startswith(f"{HERE}:{_line('caller-call-here')} ")
    assert call["owner_at"][0] == f"{HERE}:{_line('owner-call-here')} in wait_forever"
    assert call["owner_at"][-1].split(" in ")[1] == "wait"  # asyncio.Event.wait

    assert stream["what"] == "Stuck.one_then_nothing()"
    assert stream["consumer_parked"] is True
    assert 0 < stream["parked_s"] <= stream["waiting_s"]
    assert stream["submitted_at"].startswith(f"{HERE}:{_line('caller-stream-here')} ")
    assert stream["owner_at"][0] == f"{HERE}:{_line('owner-stream-here')} in one_then_nothing"

    assert "2 cross-loop operation(s) in flight" in text
    assert f"waits on {call['owner']} (thread {owner.name!r})" in text
    assert f"submitted at {call['submitted_at']}" in text
    assert "consumer parked for" in text
    # All settled: nothing of ours in flight any more.
    assert not _mine(dump_inflight(), owner)


def test_call_not_yet_started_on_a_blocked_owner(asyncio_owner: lb.LoopThread) -> None:
    engine = asyncio_owner.run(_make)
    b = lb.blocking(engine)
    entered, unblock = threading.Event(), threading.Event()

    def stuck() -> None:  # the owner loop is stuck in this callback
        entered.set()
        unblock.wait(60)

    asyncio_owner.loop.call_soon_threadsafe(stuck)
    assert entered.wait(30)
    result: list[BaseException] = []

    def waiter() -> None:
        try:
            b.wait_forever()
        except BaseException as exc:
            result.append(exc)

    # The blocking caller: a plain thread.  Submitted, but the owner cannot start it.
    t = threading.Thread(target=waiter, name="plain-caller", daemon=True)
    t.start()
    poll_until(lambda: _mine(dump_inflight(), asyncio_owner), "the call was submitted")
    entries = _mine(dump_inflight(), asyncio_owner)
    assert len(entries) == 1
    e = entries[0]
    assert e["caller"] == "plain-caller"
    assert e["started"] is False and e["running_s"] is None
    assert e["waiting_s"] > 0
    assert e["submitted_at"] is None  # site recording is off by default
    assert e["owner_thread"] == asyncio_owner.name
    # The owner thread is inside a callback (stuck()), not waiting in select().
    assert e["owner_thread_at"] is not None and "in select" not in e["owner_thread_at"]
    text = format_inflight(entries)
    assert "not started on the owner yet" in text
    assert "record_submission_sites() was off" in text
    unblock.set()
    asyncio_owner.stop()  # fails the stuck call with OwnerLoopClosed
    t.join(30)
    assert not t.is_alive()
    assert isinstance(result[0], lb.OwnerLoopClosed)


def test_call_wrapped_in_a_task_is_named_by_its_task(
    asyncio_owner: lb.LoopThread, sites: None
) -> None:
    engine = asyncio_owner.run(_make)
    p = lb.proxy(engine)

    async def main() -> list[dict[str, Any]]:
        task = asyncio.create_task(p.wait_forever(), name="the-waiting-task")
        await apoll_until(lambda: _mine(dump_inflight(), asyncio_owner), "the call was submitted")
        entries = _mine(dump_inflight(), asyncio_owner)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return entries

    entries = asyncio.run(main())  # no debug mode: the coroutine's origin is unknown
    assert [e["submitted_at"] for e in entries] == ["task 'the-waiting-task' (created elsewhere)"]


def test_record_submission_sites_returns_the_previous_setting() -> None:
    old = record_submission_sites(True)
    try:
        assert record_submission_sites(False) is True
        assert record_submission_sites(False) is False
    finally:
        record_submission_sites(old)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_signal_writes_the_dump(asyncio_owner: lb.LoopThread) -> None:
    engine = asyncio_owner.run(_make)
    p = lb.proxy(engine)
    out = io.StringIO()
    old_sites = record_submission_sites(False)
    previous = install_hang_dump(signal.SIGUSR1, file=out)
    try:
        assert record_submission_sites(True) is True  # installing turned it on

        async def main() -> None:
            # Wrapped straight in a task: the site comes from the coroutine's
            # origin, which asyncio debug mode records.
            task = asyncio.ensure_future(p.wait_forever())  # signal-call-here
            await apoll_until(
                lambda: _running(_mine(dump_inflight(), asyncio_owner)),
                "the call runs on the owner",
            )
            os.kill(os.getpid(), signal.SIGUSR1)
            # The handler runs on this (main) thread, between two bytecodes.
            await apoll_until(out.getvalue, "the dump was written")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        asyncio.run(main(), debug=True)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        record_submission_sites(old_sites)
    text = out.getvalue()
    assert "call Stuck.wait_forever()" in text
    assert f"submitted at {HERE}:{_line('signal-call-here')} in main" in text
    assert f"owner side at {HERE}:{_line('owner-call-here')} in wait_forever" in text


def test_install_off_the_main_thread_is_a_typed_error() -> None:
    errors: list[BaseException] = []

    def install() -> None:
        try:
            install_hang_dump()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=install)
    t.start()
    t.join()
    assert len(errors) == 1
    assert isinstance(errors[0], RuntimeError)
    assert "main thread" in str(errors[0])
