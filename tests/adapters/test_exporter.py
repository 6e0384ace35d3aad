"""loopbridge's series on ``/metrics`` and the owner loops' lag (loopbridge_adapters.exporter),
engine aside. Each adapter's server serves them from its real app:
tests/vllm/test_server_metrics.py and tests/sglang/test_server_metrics.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest

from loopbridge import LoopThread
from loopbridge_adapters.exporter import MetricsFirst, export_metrics, metrics_app, monitor_owner

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, Counter, values
from prometheus_client.parser import text_string_to_metric_families

Message = MutableMapping[str, Any]


@pytest.fixture
def owners() -> Iterator[list[LoopThread]]:
    started: list[LoopThread] = []
    yield started
    for thread in started:
        thread.stop()


def _owner(owners: list[LoopThread], name: str) -> LoopThread:
    thread = LoopThread(name).start()
    owners.append(thread)
    return thread


def _get(app: Any, path: str) -> tuple[int, str]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": b"",
        "headers": [],
    }
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return int(sent[0]["status"]), body.decode()


def _names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def test_metrics_and_the_paths_below_it_go_to_metrics_and_nothing_else_does() -> None:
    seen: list[tuple[str, str]] = []

    def recorder(who: str) -> Any:
        async def app(scope: Message, receive: Any, send: Any) -> None:
            seen.append((who, scope.get("path", scope["type"])))

        return app

    routed = MetricsFirst(recorder("app"), recorder("metrics"))

    async def nothing() -> Message:
        raise AssertionError("not read")

    async def unsent(message: Message) -> None:
        raise AssertionError("not sent")

    for path in ("/metrics", "/metrics/", "/metricsfoo", "/health"):
        asyncio.run(routed({"type": "http", "path": path}, nothing, unsent))
    asyncio.run(routed({"type": "lifespan"}, nothing, unsent))
    assert seen == [
        ("metrics", "/metrics"),
        ("metrics", "/metrics/"),
        ("app", "/metricsfoo"),
        ("app", "/health"),
        ("app", "lifespan"),
    ]


def test_one_monitor_per_owner_loop_each_label_unique(owners: list[LoopThread]) -> None:
    first, second = _owner(owners, "owner-a"), _owner(owners, "owner-b")
    mon = monitor_owner(first.loop, "tiny on owner")
    assert monitor_owner(first.loop, "tiny on owner") is mon  # a restart: the same one
    other = monitor_owner(second.loop, "tiny on owner")  # another engine, same label
    assert (mon.name, other.name) == ("tiny on owner", "tiny on owner #2")
    first.stop()  # its loop closes: its monitor no longer counts
    third = _owner(owners, "owner-c")
    assert monitor_owner(third.loop, "tiny on owner").name == "tiny on owner"


def test_the_default_registry_serves_the_collector_once(owners: list[LoopThread]) -> None:
    owner = _owner(owners, "owner-default")
    mon = export_metrics(owner.loop, "default on owner")
    assert mon is not None and export_metrics(owner.loop, "default on owner") is mon
    app = metrics_app(multiprocess=False)
    status, text = _get(app, "/metrics")
    assert status == 200
    assert {"loopbridge_calls", "loopbridge_loop_lag_seconds"} <= _names(text)
    loops = [
        s.labels["loop"]
        for f in text_string_to_metric_families(text)
        if f.name == "loopbridge_loop_lag_seconds"
        for s in f.samples
        if s.name.endswith("_count")
    ]
    assert loops.count("default on owner") == 1


def test_a_multiprocess_registry_serves_the_files_series_and_loopbridges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    # An engine's counter in another process writes the multiprocess files: here, a
    # counter whose values are file-backed, as that process's would be.
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())
    engine = Counter("engine_requests", "requests", registry=CollectorRegistry())
    engine.inc(3)
    status, text = _get(metrics_app(multiprocess=True), "/metrics")
    assert status == 200
    names = _names(text)
    assert {"engine_requests", "loopbridge_calls", "loopbridge_loop_lag_seconds"} <= names
