"""Shutdown in any order: the engine under an open server, or the server with streams open.

* ``shutdown_engine`` while a server streams: every open stream ends at once with an
  error event saying the engine was shut down (not "died"), the server stops by
  itself well within its grace (``exit_reason`` ENGINE_SHUT_DOWN, logged as a
  warning), and later calls through the proxy raise :class:`EngineShutDown`.
* An orderly stop that cuts streams logs one WARNING line per stream, not uvicorn's
  tracebacks.

The stand-in engine is slowed so that every stream outlives the waits here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from vllm_engines import start_engine
from vllm_load import streams_in_flight

import loopbridge_vllm
from loopbridge_vllm import engine_client_proxy, shutdown_engine, start_openai_server
from loopbridge_vllm.server import ExitReason

pytestmark = pytest.mark.every_release

STREAMS = 4
STEP_S = 0.1
MAX_TOKENS = 400  # 40 s per request at STEP_S: far longer than any bound below
BOUND_S = 30.0  # hang guard for each wait
GRACE_S = 20.0  # a stream cut only when the grace runs out would take this long


async def _stream(url: str, started: threading.Semaphore) -> tuple[str, str]:
    """One streamed completion: how it ended ('complete', 'error', 'cut') and the
    error event's message."""
    body = {"model": "tiny", "prompt": "x", "max_tokens": MAX_TOKENS, "ignore_eos": True}
    first = True
    try:
        async with (
            httpx.AsyncClient(base_url=url, timeout=BOUND_S * 2) as client,
            client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp,
        ):
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if first:
                    first = False
                    started.release()
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return "error", str(chunk["error"].get("message"))
                if chunk["choices"][0].get("finish_reason") == "length":
                    return "complete", ""
    except httpx.HTTPError as exc:
        return "cut", repr(exc)
    finally:
        if first:
            started.release()
    return "cut", ""


def _start_streams(url: str, outcomes: list[tuple[str, str]]) -> threading.Thread:
    """STREAMS streamed requests on a client thread; returns once each got a chunk."""
    return streams_in_flight(STREAMS, lambda started: _stream(url, started), outcomes, BOUND_S)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_orderly_stop_logs_each_cut_stream_in_one_warning_line(tiny_model: Path) -> None:
    owner, llm = start_engine(tiny_model, "cut-streams-owner")
    try:
        owner.run(lambda: llm.collective_rpc("standin_set_step_s", args=(STEP_S,)))
        server = start_openai_server(engine_client_proxy(llm), grace=1.0)
        # uvicorn's logger, as the server's uvicorn config set it up at start.
        records = _Records()
        logging.getLogger("uvicorn.error").addHandler(records)
        try:
            outcomes: list[tuple[str, str]] = []
            load = _start_streams(server.url, outcomes)
            server.stop()
            load.join(BOUND_S)
        finally:
            logging.getLogger("uvicorn.error").removeHandler(records)
        lines = [r.getMessage() for r in records.records]
        assert not [r for r in records.records if r.levelno >= logging.ERROR], lines
        assert not [r for r in records.records if r.exc_info], lines
        cut = [m for m in lines if "cut short" in m]
        assert 1 <= len(cut) <= STREAMS, lines
        assert server.exit_reason is None  # a stop that was asked for
    finally:
        shutdown_engine(llm)
        owner.stop(30)


def test_engine_shut_down_under_an_open_server_ends_every_stream_at_once(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    owner, llm = start_engine(tiny_model, "shut-under-server-owner")
    proxy = engine_client_proxy(llm)
    server = None
    try:
        owner.run(lambda: llm.collective_rpc("standin_set_step_s", args=(STEP_S,)))
        server = start_openai_server(proxy, grace=GRACE_S, watchdog_interval=0.05)
        outcomes: list[tuple[str, str]] = []
        load = _start_streams(server.url, outcomes)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="loopbridge_vllm.server"):
            shutdown_engine(llm)
            load.join(BOUND_S)
            assert not load.is_alive()
            ended = time.monotonic() - t0
            assert server.wait_stopped(BOUND_S)
        stopped = time.monotonic() - t0
        # Every stream got an error event that says why, long before the grace.
        assert [o for o, _ in outcomes] == ["error"] * STREAMS, outcomes
        assert all("shut down" in m and "died" not in m for _, m in outcomes), outcomes
        assert ended < GRACE_S / 2 and stopped < GRACE_S / 2, (ended, stopped)
        assert server.exit_reason is ExitReason.ENGINE_SHUT_DOWN
        said = [r for r in caplog.records if r.name == "loopbridge_vllm.server"]
        assert said and all(r.levelno == logging.WARNING for r in said)
        assert not any("died" in r.getMessage() for r in said)
        # Later calls raise loopbridge's error naming the shutdown.
        shut_down = loopbridge_vllm.EngineShutDown

        async def later() -> None:
            with pytest.raises(shut_down, match="shut down"):
                await proxy.get_supported_tasks()
            with pytest.raises(shut_down, match="shut down"):
                await proxy.collective_rpc("standin_active_requests")

        asyncio.run(later())
    finally:
        if server is not None:
            server.stop(10)
        shutdown_engine(llm)
        owner.stop(30)
