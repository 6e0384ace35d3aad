"""loopbridge's own bridge, used from foreign loops and threads, is clean
under the sanitizer: no asyncio object is touched off its owner loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from sanitizer_support import in_thread

import loopbridge as lb
from loopbridge.sanitizer import sanitize


@lb.loop_affine
class Service:
    """State that lives on its owner loop: an Event, a Queue, a Lock."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.lock = asyncio.Lock()
        self.calls = 0
        self.hanging = threading.Event()  # set on the owner when hang() starts

    async def bump(self, n: int) -> int:
        async with self.lock:
            self.calls += n
            self.queue.put_nowait(n)
            self.ready.set()
            await asyncio.sleep(0)
            return self.calls

    async def wait_ready(self) -> bool:
        return await self.ready.wait()

    async def hang(self) -> None:
        self.hanging.set()
        await asyncio.sleep(30)

    async def stream(self, k: int) -> AsyncIterator[int]:
        for i in range(k):
            await asyncio.sleep(0)
            yield await self.queue.get() if not self.queue.empty() else i


async def _calls(svc: Service) -> int:
    return svc.calls


async def _make() -> Service:
    return Service()


@pytest.mark.parametrize("use_uvloop", [False, True])
def test_proxy_from_foreign_loops_and_threads_clean(use_uvloop: bool) -> None:
    if use_uvloop:
        pytest.importorskip("uvloop")
    with sanitize("raise") as block, lb.LoopThread("svc-owner", use_uvloop=use_uvloop) as owner:
        svc = owner.run(_make)
        p = lb.proxy(svc)

        async def client() -> list[int]:
            out = [await p.bump(1), await p.bump(2)]
            assert await p.wait_ready()
            out += [x async for x in p.stream(3)]
            # cancellation crosses to the owner loop
            task = asyncio.ensure_future(p.hang())
            assert await asyncio.to_thread(svc.hanging.wait, 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # breaking out of a stream closes it on the owner loop
            async for _ in p.stream(10):
                break
            return out

        assert asyncio.run(client())[:2] == [1, 3]  # a second loop, this thread
        in_thread(lambda: asyncio.run(client()), name="other-loop")  # a third, another thread
        b = lb.blocking(p)
        assert in_thread(lambda: b.bump(5), name="plain") >= 5  # a plain thread

        async def many() -> list[int]:
            return list(await asyncio.gather(*(p.bump(1) for _ in range(50))))

        results: list[list[int]] = []
        threads = [
            threading.Thread(target=lambda: results.append(asyncio.run(many()))) for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 4 and all(len(r) == 50 for r in results)
        assert owner.run(lambda: _calls(svc)) == 2 * (1 + 2) + 5 + 4 * 50
    assert block.reports == [], "\n\n".join(str(r) for r in block.reports)


def test_raw_object_from_foreign_thread_is_flagged() -> None:
    """Control: the same Service used raw, without the proxy, is caught."""
    with sanitize("log") as block, lb.LoopThread("svc-owner") as owner:
        svc = owner.run(_make)
        owner.loop.call_soon_threadsafe(lambda: svc.queue.put_nowait(0))  # first use: owner loop
        owner.run(asyncio.sleep, 0)
        in_thread(lambda: svc.queue.put_nowait(1), name="intruder")
    assert [r.operation for r in block.reports] == ["asyncio.Queue.put_nowait"]
