"""The affinity sanitizer on real vLLM: raw ``AsyncLLM`` served from a second thread.

No race hook here: the sanitizer must flag the misuse on its first occurrence
whether or not the race fires.  Through ``loopbridge_vllm`` the same traffic
must produce no report at all.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from vllm_engines import start_engine, stop_engine
from vllm_load import run_load

import loopbridge as lb
import loopbridge.sanitizer
from loopbridge_vllm.server import OpenAIServer, start_openai_server

pytestmark = pytest.mark.vllm


def _collector_reports(
    reports: list[lb.sanitizer.SanitizerReport],
) -> list[lb.sanitizer.SanitizerReport]:
    return [
        r
        for r in reports
        if "asyncio.Event" in r.operation
        and any("output_processor.py" in s.where() for s in r.call_stack)
    ]


def test_sanitizer_flags_raw_async_llm_served_from_another_thread(tiny_model: Any) -> None:
    owner, llm = start_engine(tiny_model, "sanitized-raw-owner")
    try:
        owner.run(llm.get_supported_tasks)
        with lb.sanitizer.sanitize("log") as san:
            server = OpenAIServer(llm).start(60)  # the raw engine, as downstream did
            try:
                asyncio.run(run_load(server.url, 8, 2, timeout=20))
            finally:
                server.stop()
        flagged = _collector_reports(san.reports)
        assert flagged, [str(r) for r in san.reports][:5]
        report = flagged[0]
        # Both sides are named: the collector's put() on the engine thread, and
        # the waiter bound in get() on the server's loop.
        assert report.bind is not None and "output_processor.py" in report.bind.where()
        assert report.owner_loop != report.call_loop
    finally:
        stop_engine(owner, llm)


def test_sanitizer_is_quiet_through_loopbridge(engine_proxy: Any) -> None:
    with lb.sanitizer.sanitize("log") as san:
        server = start_openai_server(engine_proxy)
        try:
            result = asyncio.run(run_load(server.url, 32, 8, stream_fraction=0.5, timeout=60))
        finally:
            server.stop()
    assert result.failures == [] and result.ok == 32
    assert san.reports == [], [str(r) for r in san.reports][:3]
