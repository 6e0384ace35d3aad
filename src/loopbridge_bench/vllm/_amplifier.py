"""Widen the cross-loop race in vLLM's ``RequestOutputCollector`` deterministically.

``RequestOutputCollector.put`` (called by ``AsyncLLM``'s output handler on the
engine's owner loop) calls ``asyncio.Event.set``, which iterates the event's
waiter deque and resolves each waiter. When the waiter belongs to another
thread's loop (a server thread awaiting ``get``), that thread removes its
future from the deque when it wakes. If that happens while ``set`` is still
iterating, CPython raises ``RuntimeError: deque mutated during iteration`` in
the output handler, which kills it.

In production the window is a few microseconds. :class:`CollectorSetHold`
makes it certain: it wraps ``asyncio.Event.set`` only when the caller is
``RequestOutputCollector.put`` and a waiter belongs to a loop other than the
running one. It then runs the *original* ``Event.set`` with one extra item at
the end of the waiter deque whose ``done()`` holds the setter (after the real
waiter was resolved) until the foreign-loop waiter has run, waking that loop
as network traffic would. When every waiter lives on the running loop (the
loop-safe path) it does nothing but count.

It patches a class attribute of ``asyncio.Event``, so it affects the whole
process while installed: the benchmark installs it only around its
correctness phase, never during the latency rounds.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any


def _noop() -> None:
    pass


__all__ = ["CollectorSetHold"]


class CollectorSetHold:
    """Hold ``Event.set`` from ``RequestOutputCollector.put`` until a foreign waiter ran."""

    def __init__(self, hold_timeout: float = 1.0) -> None:
        from vllm.v1.engine.output_processor import RequestOutputCollector

        self._put_code = RequestOutputCollector.put.__code__
        self._hold_timeout = hold_timeout
        self._original: Callable[[asyncio.Event], None] | None = None
        self._lock = threading.Lock()
        self.collector_sets = 0  # Event.set calls made by RequestOutputCollector.put
        self.foreign_sets = 0  # ... of which had a waiter on another loop
        self.overlaps = 0  # ... in which that waiter ran while set() was held

    def install(self) -> CollectorSetHold:
        if self._original is not None:
            raise RuntimeError("already installed")
        original = asyncio.Event.set
        hook = self

        def set(self: asyncio.Event) -> None:
            if sys._getframe(1).f_code is not hook._put_code:
                return original(self)
            return hook._collector_set(self, original)

        self._original = original
        asyncio.Event.set = set  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        if self._original is not None:
            asyncio.Event.set = self._original  # type: ignore[method-assign,assignment]
            self._original = None

    def __enter__(self) -> CollectorSetHold:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _collector_set(
        self, event: asyncio.Event, original: Callable[[asyncio.Event], None]
    ) -> None:
        with self._lock:
            self.collector_sets += 1
        waiters: deque[Any] | None = getattr(event, "_waiters", None)
        if event.is_set() or not waiters:
            return original(event)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        foreign = [f for f in list(waiters) if f.get_loop() is not running and not f.done()]
        if not foreign:
            return original(event)
        with self._lock:
            self.foreign_sets += 1
        hold = _Hold(self, waiters, foreign)
        waiters.append(hold)
        try:
            original(event)
        finally:
            try:
                waiters.remove(hold)
            except (ValueError, RuntimeError):
                pass


class _Hold:
    """A fake waiter: ``Event.set`` calls ``done()`` on it after the real ones."""

    def __init__(self, hook: CollectorSetHold, waiters: deque[Any], foreign: list[Any]) -> None:
        self._hook = hook
        self._waiters = waiters
        self._foreign = foreign

    def get_loop(self) -> None:  # never the running loop: never resolved by set()
        return None

    def done(self) -> bool:
        before = len(self._waiters)
        for fut in self._foreign:
            try:
                fut.get_loop().call_soon_threadsafe(_noop)
            except RuntimeError:
                pass
        deadline = time.monotonic() + self._hook._hold_timeout
        while len(self._waiters) >= before and time.monotonic() < deadline:
            time.sleep(0.0002)
        if len(self._waiters) < before:
            with self._hook._lock:
                self._hook.overlaps += 1
        return True  # "already done": Event.set skips set_result on it
