"""The owner loop stops mid-stream: the server stops, clients get errors, the EngineCore drains.

In the first test the owner loop is stopped with ``loop.stop()`` while streams
are running, and is not cleaned up: its tasks stay suspended, as after an owner
that returned from ``run_forever`` and moved on. Requests are long (the
stand-in engine is slowed), so a request still counted by the EngineCore after
the stop was not aborted. The loop is run again afterwards only to ask the
EngineCore how many requests it still runs.

In the second the owner is a ``LoopThread`` that is stopped, so its loop is
cleaned up and closed: the EngineCore cannot be asked anything after that, so
the test counts the aborts vLLM sends it, which must cover every request.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from vllm_engines import start_engine
from vllm_load import streams_in_flight

from loopbridge_vllm import engine_client_proxy, shutdown_engine, start_openai_server
from loopbridge_vllm.server import ExitReason

STREAMS = 6
STEP_S = 0.1
MAX_TOKENS = 480  # 48 s per request at STEP_S: far longer than any bound below
BOUND_S = 15.0  # hang guard for each wait


class ResumableOwner:
    """An owner loop on a thread; stop() leaves it as is, resume() runs it again."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._resume = threading.Event()
        self._quit = False
        self.stopped = threading.Event()
        self._thread = threading.Thread(target=self._main, name="resumable-owner", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        while True:
            self.loop.run_forever()
            self.stopped.set()
            if self._quit:
                return
            self._resume.wait()
            self._resume.clear()
            self.stopped.clear()

    def run(self, coro: Any, timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        assert self.stopped.wait(BOUND_S)

    def resume(self) -> None:
        self._resume.set()

    def close(self) -> None:
        self._quit = True
        if not self.stopped.is_set():
            self.loop.call_soon_threadsafe(self.loop.stop)
        else:
            self._resume.set()
        self._thread.join(30)
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()


@pytest.fixture
def resumable_engine(tiny_model: Path) -> Iterator[tuple[ResumableOwner, Any]]:
    from loopbridge_vllm.cpu_engine import make_async_llm

    owner = ResumableOwner()
    llm = owner.run(make_async_llm(tiny_model))
    try:
        yield owner, llm
    finally:
        if owner.stopped.is_set():
            owner.resume()
        shutdown_engine(llm)
        owner.close()


async def _core_active(llm: Any) -> int:
    return int((await llm.collective_rpc("standin_active_requests"))[0])


async def _core_drained(llm: Any) -> int:
    """The EngineCore's running requests, polled until 0 or the bound."""
    deadline = asyncio.get_running_loop().time() + BOUND_S
    active = await _core_active(llm)
    while active and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        active = await _core_active(llm)
    return active


async def _stream(url: str, started: threading.Semaphore) -> str:
    """One streamed completion; how it ended: 'complete', 'error' or 'cut'."""
    body = {
        "model": "tiny",
        "prompt": "x",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    first = True
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=BOUND_S) as client,
            client.stream("POST", "/v1/completions", json=body) as resp,
        ):
            if resp.status_code != 200:
                return "error"
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if first:
                    first = False
                    started.release()
                if line == "data: [DONE]":
                    return "cut"
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return "error"
                if chunk["choices"][0].get("finish_reason") == "length":
                    return "complete"
    except httpx.HTTPError:
        return "error"
    finally:
        if first:
            started.release()
    return "cut"


def _start_streams(url: str, outcomes: list[str]) -> threading.Thread:
    """STREAMS streamed requests on a client thread; returns once each got a chunk."""
    return streams_in_flight(STREAMS, lambda started: _stream(url, started), outcomes, BOUND_S)


def test_owner_stop_mid_stream_stops_server_and_drains_engine(
    resumable_engine: tuple[ResumableOwner, Any],
) -> None:
    owner, llm = resumable_engine
    owner.run(llm.collective_rpc("standin_set_step_s", args=(STEP_S,)))
    server = start_openai_server(engine_client_proxy(llm), grace=1.0)
    outcomes: list[str] = []
    load = _start_streams(server.url, outcomes)
    try:
        assert owner.run(_core_active(llm)) == STREAMS  # every request reached the EngineCore
        owner.stop()

        server.thread.join(BOUND_S)
        assert not server.thread.is_alive(), "server still up after its owner loop stopped"
        assert server.exit_reason is ExitReason.OWNER_LOOP_STOPPED
        load.join(BOUND_S)
        assert not load.is_alive()
        # Each client was told: an error, or a stream cut short (never a full answer).
        assert sorted(outcomes) and set(outcomes) <= {"error", "cut"}, outcomes
    finally:
        server.stop(10)
        load.join(BOUND_S)
    owner.resume()
    assert owner.run(_core_drained(llm)) == 0
    owner.run(llm.collective_rpc("standin_set_step_s", args=(0.0,)))


def test_owner_close_mid_stream_stops_server_and_aborts_every_request(tiny_model: Path) -> None:
    owner, llm = start_engine(tiny_model, "closing-owner")
    aborts: collections.Counter[str] = collections.Counter()
    original = type(llm).abort

    async def abort(request_id: Any, internal: bool = False) -> None:
        await original(llm, request_id, internal=internal)
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            aborts[rid] += 1  # counted once vLLM has sent it to the EngineCore

    llm.abort = abort
    server = None
    try:
        owner.run(lambda: llm.collective_rpc("standin_set_step_s", args=(STEP_S,)))
        server = start_openai_server(engine_client_proxy(llm), grace=1.0)
        outcomes: list[str] = []
        load = _start_streams(server.url, outcomes)
        running = owner.run(lambda: _running_ids(llm))
        assert len(running) == STREAMS
        owner.stop(30)  # cancels the loop's tasks, then closes it

        server.thread.join(BOUND_S)
        assert not server.thread.is_alive(), "server still up after its owner loop closed"
        load.join(BOUND_S)
        assert not load.is_alive()
        assert sorted(outcomes) and set(outcomes) <= {"error", "cut"}, outcomes
        assert all(aborts[rid] == 1 for rid in running), (running, aborts)
    finally:
        if server is not None:
            server.stop(10)
        del llm.abort
        shutdown_engine(llm)
        owner.stop(30)


async def _running_ids(llm: Any) -> list[str]:
    # On the owner loop: the output processor's requests (internal ids).
    return list(llm.output_processor.request_states)
