"""The downstream failure, reproduced with real vLLM, and the same run made safe.

Topology of the bug report: ``AsyncLLM`` created on one loop (a Ray actor's),
vLLM's OpenAI app served by uvicorn on a second thread. With the raw engine
handed to the server, the server thread waits on each request's
``RequestOutputCollector`` event while the engine's output handler sets it
from the owner thread. ``loopbridge_bench.vllm.CollectorSetHold`` makes the overlap
certain, so the raw run must kill the output handler with ``deque mutated
during iteration``; the same run through ``loopbridge_vllm`` must finish all
128 requests.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from vllm_engines import start_engine, stop_engine
from vllm_load import run_load

from loopbridge_bench.vllm import CollectorSetHold
from loopbridge_vllm.server import OpenAIServer, ServerStartError, start_openai_server

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = [pytest.mark.vllm, pytest.mark.every_release]

N_REQUESTS = 128
CONCURRENCY = 16


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_raw_async_llm_shared_with_server_thread_dies(tiny_model: Any) -> None:
    owner, llm = start_engine(tiny_model, "raw-engine-owner")
    records = _Records()
    handler_log = logging.getLogger("vllm.v1.engine.async_llm")
    handler_log.addHandler(records)
    try:
        # Warm the cached task list on the owner loop (vLLM's own server does
        # the same at start-up) so the server thread needs no utility call.
        owner.run(llm.get_supported_tasks)
        assert not llm.errored
        with CollectorSetHold() as hook:
            server = OpenAIServer(llm).start(60)  # the raw engine, as downstream did
            try:
                result = asyncio.run(run_load(server.url, N_REQUESTS, CONCURRENCY, timeout=20))
            finally:
                server.stop()
        # The hook really saw a waiter from the server loop and held set().
        assert hook.foreign_sets >= 1 and hook.overlaps >= 1
        # Requests failed, and the engine's output handler is dead.
        assert result.failures, "raw AsyncLLM served from another thread did not fail"
        assert result.ok < N_REQUESTS
        assert llm.output_handler is not None and llm.output_handler.done()
        assert llm.errored and not llm.is_running
        causes = [r.exc_info[1] for r in records.records if r.exc_info]
        assert any(
            isinstance(c, RuntimeError) and "deque mutated during iteration" in str(c)
            for c in causes
        ), f"unexpected failure: {causes!r} / {result.failures[:3]}"
        # A dead engine is never served again.
        with pytest.raises(ServerStartError):
            start_openai_server(llm)
    finally:
        handler_log.removeHandler(records)
        stop_engine(owner, llm)


def test_same_run_through_loopbridge_is_safe(
    shared_engine: tuple[Any, Any], engine_proxy: Any
) -> None:
    _, llm = shared_engine

    with CollectorSetHold() as hook:
        server = start_openai_server(engine_proxy)
        try:
            result = asyncio.run(run_load(server.url, N_REQUESTS, CONCURRENCY, timeout=60))
        finally:
            server.stop()
    assert result.failures == []
    assert result.ok == N_REQUESTS
    # The hook was active and saw every collector wake-up, but all waiters were
    # on the owner loop: nothing to overlap.
    assert hook.collector_sets >= N_REQUESTS
    assert hook.foreign_sets == 0
    assert not llm.errored and llm.is_running
