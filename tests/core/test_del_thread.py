"""Where an object's ``__del__`` runs when a proxy held the last reference (issue 53, item 8).

Decided: on its owner loop.  A proxy dropped on another thread (a plain thread,
another loop's) that held the last reference hands it to the owner loop, which
frees the object, so ``__del__`` runs on the thread and loop that own its state,
as it would had the object been dropped there.  Where the owner loop is gone,
there is no loop to run it: it runs where the proxy was dropped.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import loopbridge as lb
from loopbridge_adapters.free_threaded import FREE_THREADED

BOUND = 10.0
#: On a free-threaded build an object whose last reference another thread drops is
#: freed by the thread that made it, the next time that thread runs Python code
#: (biased reference counting): a wait there runs some, in slices, and has the owner
#: loop run some too (the object was made there; an idle loop runs none).
SLICE = 0.01


class Record:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def wait(self, owner: lb.LoopThread | None = None) -> Record:
        if not FREE_THREADED:
            assert self.done.wait(BOUND), "__del__ did not run"
            return self
        for _ in range(int(BOUND / SLICE)):
            if self.done.wait(SLICE):
                return self
            if owner is not None:
                owner.run(_nothing)
        raise AssertionError("__del__ did not run")


async def _nothing() -> None:
    """A step of Python on the owner loop's thread (see SLICE)."""


def _freed_where_made(record: Record, owner: lb.LoopThread) -> bool:
    """Free-threaded build: the object died on its owner loop, or on this thread,
    which made the proxy and a finished call's arguments: when one of those is the
    last holder, biased reference counting frees it here (docs/free-threading.md)."""
    here = threading.current_thread()
    return record.loop is owner.loop or (record.thread is here and record.loop is None)


@lb.loop_affine
class Session:
    def __init__(self, record: Record) -> None:
        self.record = record
        self.held = [object()]

    async def ping(self) -> str:
        return "pong"

    def __del__(self) -> None:
        r = self.record
        r.thread = threading.current_thread()
        try:
            r.loop = asyncio.get_running_loop()
        except RuntimeError:
            r.loop = None
        r.done.set()


def _proxied(owner: lb.LoopThread, record: Record) -> Any:
    async def make() -> Session:
        return Session(record)

    p = lb.proxy(owner.run(make))
    assert lb.blocking(p).ping() == "pong"  # used across threads: its port exists
    gc.collect()  # nothing else holds it: what run() made is gone
    return p


def test_dropped_on_a_plain_thread_it_dies_on_its_owner_loop(owner: lb.LoopThread) -> None:
    record = Record()
    p = _proxied(owner, record)
    del p  # the last reference, on this (plain) thread
    record.wait()
    assert record.loop is owner.loop
    assert record.thread is not threading.current_thread()


def test_dropped_on_another_loop_it_dies_on_its_owner_loop(owner: lb.LoopThread) -> None:
    record = Record()
    holder = [_proxied(owner, record)]

    async def elsewhere() -> asyncio.AbstractEventLoop:
        assert await holder[0].ping() == "pong"
        holder.clear()  # the last reference, on this loop
        return asyncio.get_running_loop()

    other = asyncio.run(elsewhere())
    record.wait(owner)
    assert record.loop is not other
    if FREE_THREADED:  # see _freed_where_made
        assert _freed_where_made(record, owner)
        return
    assert record.loop is owner.loop


def test_dropped_on_its_owner_loop_it_dies_there_at_once(owner: lb.LoopThread) -> None:
    record = Record()
    holder = [_proxied(owner, record)]

    async def drop() -> bool:
        holder.clear()
        return record.done.is_set()  # already: nothing was posted

    at_once = owner.run(drop)
    if FREE_THREADED:
        # The proxy was made on this thread, which frees it (see SLICE).
        record.wait(owner)
        assert _freed_where_made(record, owner)
        return
    assert at_once is True
    assert record.loop is owner.loop


def test_a_proxy_that_is_not_the_last_holder_changes_nothing(owner: lb.LoopThread) -> None:
    record = Record()
    p = _proxied(owner, record)
    target = lb.unwrap(p)
    del p
    gc.collect()
    assert not record.done.is_set()  # the object lives on: it is referenced here
    del target  # the last reference is this thread's own: __del__ runs here
    if FREE_THREADED:  # or where it was made, when that thread next runs (see SLICE)
        record.wait(owner)
        assert _freed_where_made(record, owner)
        return
    record.wait()
    assert record.thread is threading.current_thread() and record.loop is None


def test_with_its_owner_loop_gone_it_dies_where_dropped() -> None:
    owner = lb.LoopThread(name="gone")
    owner.start()
    record = Record()
    p = _proxied(owner, record)
    owner.stop()
    del p
    record.wait()
    assert record.thread is threading.current_thread()


def test_a_blocking_face_that_held_the_last_reference(owner: lb.LoopThread) -> None:
    record = Record()
    b = lb.blocking(_proxied(owner, record))
    assert b.ping() == "pong"  # its members hold the object too
    del b
    record.wait()
    assert record.loop is owner.loop
