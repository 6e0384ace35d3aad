"""loopbridge's series on the real server's ``/metrics``, next to vLLM's, on by default."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_engines import start_engine, stop_engine
from vllm_load import LoadResult, run_load

from loopbridge import LoopThread
from loopbridge_vllm import OpenAIServer, start_openai_server

REQUESTS = 48
BUSY_S = 0.6  # the owner loop is held this long in one callback
LAG_OVER_S = 0.25  # a lag probe later than this can only come from the held loop
OWNER_LABEL = "tiny on engine-owner"  # model and owner thread (see conftest)

Sample = tuple[str, tuple[tuple[str, str], ...], float]


def _scrape(url: str) -> list[Sample]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return [
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def _value(samples: Iterable[Sample], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for n, ls, v in samples if n == name and want <= set(ls))


def _lag_samples_over(samples: list[Sample], bound: float) -> float:
    """Owner-loop lag probes later than ``bound`` (from the histogram's buckets)."""
    count = _value(samples, "loopbridge_loop_lag_seconds_count", loop=OWNER_LABEL)
    within = [
        v
        for n, ls, v in samples
        if n == "loopbridge_loop_lag_seconds_bucket"
        and dict(ls).get("loop") == OWNER_LABEL
        and float(dict(ls)["le"]) <= bound
    ]
    return count - max(within, default=0.0)


@pytest.fixture(scope="module")
def stats_server(tiny_model: Path) -> Iterator[OpenAIServer]:
    """An engine that records vLLM's own statistics, as `vllm serve` does by default."""
    owner, llm = start_engine(tiny_model, "stats-owner", disable_log_stats=False)
    try:
        # Slow steps keep streams open long enough for scrapes to see them.
        owner.run(lambda: llm.collective_rpc("standin_set_step_s", args=(0.01,)))
        server = start_openai_server(llm, grace=1.0)
        yield server
        server.stop()
    finally:
        stop_engine(owner, llm)


def test_bridge_series_next_to_vllm_series_under_streaming_load(
    stats_server: OpenAIServer,
) -> None:
    url = stats_server.url
    before = _scrape(url)
    admitted = _value(before, "loopbridge_admission_seconds_count")
    result = LoadResult()

    def load() -> None:
        done = asyncio.run(run_load(url, REQUESTS, 8, stream_fraction=1.0, max_tokens=32))
        result.ok, result.failures = done.ok, done.failures

    loader = threading.Thread(target=load, name="stream-load")
    loader.start()
    try:
        # Scrape while streams are open (poll with a deadline).
        during: list[Sample] = []
        deadline = time.monotonic() + 60
        while loader.is_alive() and time.monotonic() < deadline:
            during = _scrape(url)
            if _value(during, "loopbridge_streams_open") > 0:
                break
        assert _value(during, "loopbridge_streams_open") > 0, "no scrape saw a stream open"
        names = {name for name, _, _ in during}
        assert "vllm:num_requests_running" in names
        for name in (
            "loopbridge_calls_total",
            "loopbridge_streams_total",
            "loopbridge_streams_open",
            "loopbridge_admission_seconds_count",
            "loopbridge_stream_items_per_wakeup_count",
            "loopbridge_loop_lag_seconds_count",
            "loopbridge_loop_lag_max_seconds",
        ):
            assert name in names, name
    finally:
        loader.join(120)
    assert result.ok == REQUESTS and result.failures == []
    after = _scrape(url)
    # Every streamed request was admitted to the owner loop at least once.
    assert _value(after, "loopbridge_admission_seconds_count") - admitted >= REQUESTS
    # No loopbridge series collides with vLLM's, and each is exported once.
    keys = [(n, ls) for n, ls, _ in after if n.startswith("loopbridge_")]
    assert len(keys) == len(set(keys))


def test_owner_loop_lag_rises_when_the_owner_loop_is_busy(
    shared_engine: tuple[LoopThread, Any], shared_server: OpenAIServer
) -> None:
    owner, _ = shared_engine
    url = shared_server.url
    late_before = _lag_samples_over(_scrape(url), LAG_OVER_S)
    held = threading.Event()

    def busy() -> None:  # the owner loop runs nothing else meanwhile
        held.set()
        threading.Event().wait(BUSY_S)

    owner.loop.call_soon_threadsafe(busy)
    assert held.wait(30)
    deadline = time.monotonic() + 60
    late = late_before
    while late == late_before and time.monotonic() < deadline:
        late = _lag_samples_over(_scrape(url), LAG_OVER_S)
    assert late > late_before
    assert _value(_scrape(url), "loopbridge_loop_lag_max_seconds", loop=OWNER_LABEL) >= LAG_OVER_S


def test_second_server_and_restart_register_nothing_twice(
    engine_proxy: Any, shared_server: OpenAIServer
) -> None:
    first = start_openai_server(engine_proxy, grace=1.0)
    first.stop()
    again = start_openai_server(engine_proxy, grace=1.0)  # a restart in the same process
    try:
        for url in (shared_server.url, again.url):
            samples = _scrape(url)
            keys = [(n, ls) for n, ls, _ in samples if n.startswith("loopbridge_")]
            assert keys and len(keys) == len(set(keys))
            loops = {
                dict(ls)["loop"] for n, ls, _ in samples if n == "loopbridge_loop_lag_seconds_count"
            }
            assert OWNER_LABEL in loops
            assert not any(label.startswith(f"{OWNER_LABEL} #") for label in loops)
    finally:
        again.stop()


def test_metrics_off_starts_no_lag_monitor(
    engine_proxy: Any, monkeypatch: Any, shared_server: OpenAIServer
) -> None:
    from loopbridge_vllm import server as server_module

    calls: list[object] = []
    monkeypatch.setattr(server_module, "export_metrics", lambda *a: calls.append(a))
    off = start_openai_server(engine_proxy, grace=1.0, metrics=False)
    off.stop()
    on = start_openai_server(engine_proxy, grace=1.0)
    on.stop()
    assert len(calls) == 1  # only the server with metrics on asked for them
