"""Cancellation becomes exactly one vLLM abort, on the owner loop.

The engine is slowed down (the stand-in's step time) so that requests are
still running when their clients leave. A counting wrapper on the engine's
``abort`` records every abort vLLM performs and the loop it runs on; the
engine-side counts (front-end output processor and the EngineCore's own view,
through the stand-in worker) must drop to zero.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from vllm_engines import settled_counts

from loopbridge import LoopThread, blocking
from loopbridge_vllm import OpenAIServer

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release

ABORT_GUARD_S = 60


class AbortLog:
    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.calls: collections.Counter[str] = collections.Counter()
        self.loops: set[asyncio.AbstractEventLoop] = set()
        self.threads: set[str] = set()
        self.finished = 0  # aborts that returned (vLLM sent them to the EngineCore)
        self._changed = threading.Condition()
        original = type(llm).abort

        async def abort(request_id: Any, internal: bool = False) -> None:
            ids = [request_id] if isinstance(request_id, str) else list(request_id)
            for rid in ids:
                self.calls[rid] += 1
            self.loops.add(asyncio.get_running_loop())
            self.threads.add(threading.current_thread().name)
            try:
                await original(llm, request_id, internal=internal)
            finally:
                with self._changed:
                    self.finished += 1
                    self._changed.notify_all()

        llm.abort = abort  # generate() calls self.abort(...)

    def wait_finished(self, n: int) -> int:
        """Wait until ``n`` aborts returned; the number that did.

        The bound is a hang guard: a server aborts a request when it notices that
        the client left, after the client's side is done."""
        with self._changed:
            self._changed.wait_for(lambda: self.finished >= n, ABORT_GUARD_S)
            return self.finished

    def remove(self) -> None:
        del self.llm.abort


@pytest.fixture
def slow_engine(
    shared_engine: tuple[LoopThread, Any],
) -> Iterator[tuple[LoopThread, Any, AbortLog]]:
    owner, llm = shared_engine
    rpc = blocking(_proxy_of(llm)).collective_rpc
    rpc("standin_set_step_s", args=(0.02,))
    log = AbortLog(llm)
    try:
        yield owner, llm, log
    finally:
        log.remove()
        rpc("standin_set_step_s", args=(0.0,))


def _proxy_of(llm: Any) -> Any:
    from loopbridge_vllm import engine_client_proxy

    return engine_client_proxy(llm)


async def _leave_after_first_chunk(url: str, n: int, *, chat: bool) -> int:
    left = 0
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(i: int) -> None:
            nonlocal left
            if chat:
                path, body = (
                    "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": f"q{i}"}]},
                )
            else:
                path, body = "/v1/completions", {"prompt": f"p{i}"}
            body.update(model="tiny", max_tokens=300, ignore_eos=True, stream=True)
            async with client.stream("POST", path, json=body) as resp:
                assert resp.status_code == 200
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        left += 1
                        return  # closes the connection mid-stream

        await asyncio.gather(*(one(i) for i in range(n)))
    return left


def test_http_disconnect_storm_aborts_each_request_once(
    slow_engine: tuple[LoopThread, Any, AbortLog], shared_server: OpenAIServer
) -> None:
    owner, llm, log = slow_engine
    left = asyncio.run(_leave_after_first_chunk(shared_server.url, 24, chat=False))
    left += asyncio.run(_leave_after_first_chunk(shared_server.url, 24, chat=True))
    assert left == 48
    assert log.wait_finished(48) == 48
    front, core = owner.run(settled_counts, llm)
    assert (front, core) == (0, 0)
    # Every request was cut short (300 tokens at 20 ms a step take 6 s), so each
    # was aborted, once, and every abort ran on the owner loop.
    assert len(log.calls) == 48
    assert set(log.calls.values()) == {1}
    assert log.loops == {owner.loop}
    assert not llm.errored


def test_cancelled_caller_on_another_loop_aborts_once(
    slow_engine: tuple[LoopThread, Any, AbortLog], engine_proxy: Any
) -> None:
    from vllm import SamplingParams

    owner, llm, log = slow_engine

    async def consume(rid: str, got_one: asyncio.Event) -> None:
        params = SamplingParams(max_tokens=300, ignore_eos=True)
        async for _ in engine_proxy.generate("hello", params, rid):
            got_one.set()

    async def main() -> None:
        events = [asyncio.Event() for _ in range(8)]
        tasks = [asyncio.create_task(consume(f"cancel-{i}", e)) for i, e in enumerate(events)]
        await asyncio.gather(*(e.wait() for e in events))
        for t in tasks:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)

    asyncio.run(main())
    # No wait: a cancelled caller resumes only after the owner's abort ran.
    assert log.finished == 8
    assert owner.run(settled_counts, llm) == (0, 0)
    assert len(log.calls) == 8 and set(log.calls.values()) == {1}
    assert log.loops == {owner.loop}


def test_thread_that_stops_iterating_aborts_once(
    slow_engine: tuple[LoopThread, Any, AbortLog], engine_proxy: Any
) -> None:
    from vllm import SamplingParams

    owner, llm, log = slow_engine
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    with blocking(engine_proxy).generate("hello", params, "thread-stop") as stream:
        first = next(stream)
    assert not first.finished
    assert log.finished == 1  # closing the stream waited for the owner's abort
    assert owner.run(settled_counts, llm) == (0, 0)
    assert sum(log.calls.values()) == 1 and log.loops == {owner.loop}


def test_finished_requests_are_not_aborted(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    from vllm import SamplingParams

    _, llm = shared_engine
    log = AbortLog(llm)
    try:

        async def main() -> int:
            outs = [
                o
                async for o in engine_proxy.generate(
                    "x", SamplingParams(max_tokens=4, ignore_eos=True), "done-1"
                )
            ]
            return len(outs[-1].outputs[0].token_ids)

        assert asyncio.run(main()) == 4
    finally:
        log.remove()
    assert sum(log.calls.values()) == 0
