"""Shared pieces for the sanitizer tests: a loop on a thread, and the
vLLM-shaped collector scenario (also run in a subprocess against real vLLM)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class LoopInThread:
    """An asyncio loop running in a named thread (test scaffolding, kept apart
    from the core's LoopThread so these tests do not depend on it)."""

    def __init__(
        self,
        name: str,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
    ) -> None:
        self.loop = loop_factory()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._ready = threading.Event()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def __enter__(self) -> LoopInThread:
        self.thread.start()
        assert self._ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(drain(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        assert not self.thread.is_alive()
        self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> ConcurrentFuture[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 5) -> T:
        return self.submit(coro).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 5) -> T:
        """Run a plain function on the loop's thread, inside the loop."""

        async def inner() -> T:
            return fn()

        return self.run(inner(), timeout)


def in_thread(fn: Callable[[], T], name: str = "foreign") -> T:
    """Run ``fn`` in a fresh plain thread (no loop); return or re-raise."""
    box: list[Any] = []

    def main() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed back to the caller
            box.append((False, exc))

    t = threading.Thread(target=main, name=name)
    t.start()
    t.join(10)
    assert box, "thread did not finish"
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


# --- the vLLM pattern --------------------------------------------------------


class CollectorLike(Protocol):
    def put(self, output: Any) -> None: ...
    async def get(self) -> Any: ...


class SlotCollector:
    """Same shape as vLLM's RequestOutputCollector: one slot and an
    asyncio.Event; put() is called by the output handler, get() by the
    request's consumer."""

    def __init__(self) -> None:
        self.output: Any = None
        self.ready = asyncio.Event()

    def put(self, output: Any) -> None:
        if self.output is None:
            self.output = output
            self.ready.set()
        else:
            self.output = output  # vLLM merges deltas here

    async def get(self) -> Any:
        while (output := self.output) is None:
            await self.ready.wait()
        self.output = None
        self.ready.clear()
        return output


def collector_pattern(
    make_collector: Callable[[], CollectorLike],
    make_item: Callable[[], Any],
    consumer_first: bool = True,
) -> dict[str, Any]:
    """Consumer on loop B (thread 'server-loop') waits in get(); the producer
    on loop A (thread 'engine-loop') calls put(). Runs under sanitize("log")
    so the scenario completes, and returns what the sanitizer reported."""
    from loopbridge.sanitizer import sanitize

    with (
        sanitize("log") as block,
        LoopInThread("engine-loop") as a,
        LoopInThread("server-loop") as b,
    ):
        collector = b.call(make_collector)
        got: ConcurrentFuture[Any] | None = None
        if consumer_first:
            got = b.submit(collector.get())
            # wait until the consumer is parked on the event (waiter bound to B)
            for _ in range(500):
                if b.call(lambda: bool(collector.ready._waiters)):
                    break
                threading.Event().wait(0.002)
        item = a.call(make_item)
        a.call(lambda: collector.put(item))
        if got is None:
            got = b.submit(collector.get())
        # The foreign set() does not wake loop B's selector; nudge it so the
        # scenario finishes either way.
        for _ in range(200):
            if got.done():
                break
            b.loop.call_soon_threadsafe(lambda: None)
            threading.Event().wait(0.005)
        delivered = got.result(5) is item
    return {
        "delivered": delivered,
        "reports": [
            {
                "operation": r.operation,
                "kind": r.kind,
                "call_function": r.call_site.code.co_name if r.call_site.code else None,
                "call_thread": r.call_site.thread,
                "bind_function": r.bind.code.co_name if r.bind and r.bind.code else None,
                "bind_thread": r.bind.thread if r.bind else None,
                "owner_thread": r.owner_thread,
                "message": r.message(),
            }
            for r in block.reports
        ],
    }


def skip_if_installed_for_session() -> None:
    """For tests about the sanitizer being off: meaningless when a whole test
    session runs under ``--loopbridge-sanitize``."""
    import pytest

    from loopbridge.sanitizer import _instrument

    if _instrument.patched():
        pytest.skip("the sanitizer is installed for the whole session")
