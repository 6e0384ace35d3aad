"""examples/sync_web_views.py: sync views on 16 worker threads sharing one
httpx.AsyncClient owned by a background LoopThread, against a real uvicorn
upstream.  No connection is leaked, and shutdown closes the loop last."""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import loopbridge as lb

from .common import from_threads
from .conftest import HttpServer

pytest.importorskip("httpx", reason="httpx is not installed (dependency group: recipes)")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def example() -> Iterator[Any]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module("sync_web_views")
    finally:
        sys.path.remove(str(EXAMPLES))


def _until(condition: Any, seconds: float = 30.0) -> bool:
    # The upstream server drops a closed connection on its own loop, with no
    # hook to wait on: poll, bounded.
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.01)
    return True


def test_sync_views_share_one_async_client(example: Any, http_server: HttpServer) -> None:
    before = set(threading.enumerate())
    app = example.App(http_server.url).start()
    owner = app.upstream.owner

    def get(i: int) -> Any:
        with urllib.request.urlopen(f"{app.url}/item/{i}", timeout=30) as response:
            return json.loads(response.read())

    try:
        got = from_threads(get, 400, workers=32)  # more clients than workers
        assert [g["item"] for g in got] == [{"n": i} for i in range(400)]
        workers = {g["worker"] for g in got}
        assert all(w.startswith("worker") for w in workers) and 1 < len(workers) <= 16
        pool = lb.unwrap(app.upstream.client)._transport._pool
        assert 0 < len(pool.connections) <= 16  # one pool, bounded, reused by every view
        assert http_server.open_connections() <= 16
    finally:  # a failure above must not leave the app's threads running the session on
        app.stop()
    assert app.stopped == ["web server", "client and its loop"]
    assert owner.loop.is_closed() and not owner.running  # the loop closed last
    assert pool.connections == []  # closed on the loop that owned them
    assert _until(lambda: http_server.open_connections() == 0), "upstream connections leaked"
    assert set(threading.enumerate()) <= before, "a thread outlived the app"
    with pytest.raises(lb.OwnerLoopClosed):
        app.upstream.get_json("/json/1")  # after shutdown: a clear error, not a hang
