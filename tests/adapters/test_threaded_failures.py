"""How a threaded server fails where a library caller can see it: a busy port, cut requests.

* A port that is already taken raises the start error naming the address and the
  fix, never a bare ``OSError``.
* An orderly stop that cuts requests short logs one WARNING line per request, not
  uvicorn's ``Exception in ASGI application`` traceback at ERROR.

The server and app are test_threaded's stand-ins (no engine).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.test_threaded import BOUND_S, _App, _Server, _StartError
from loopbridge import LoopThread
from loopbridge_adapters.threaded import ServerStartError

pytest.importorskip("uvicorn", reason="the recipes group is not installed")
httpx = pytest.importorskip("httpx", reason="the test group is not installed")


@pytest.fixture
def owner() -> Iterator[LoopThread]:
    thread = LoopThread(name="test-owner").start()
    yield thread
    thread.stop()


class _Binding(_Server):
    """The stand-in server, binding ``host:port`` itself (as the adapters' servers do)."""

    def __init__(self, owner: LoopThread, app: _App, port: int) -> None:
        self.owner_loop = owner.loop
        self.app = app
        self.engine_dead = None
        self.owner_gate = threading.Event()
        self.owner_gate.set()
        self.exit_signalled = threading.Event()
        self.owner_stopped_seen = []
        super(_Server, self).__init__(
            host="127.0.0.1",
            port=port,
            grace=BOUND_S,
            watchdog_interval=0.01,
            name="test-binding-server",
            use_uvloop=False,
        )


def test_a_busy_port_raises_the_start_error_naming_the_address_and_the_fix(
    owner: LoopThread,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(_StartError) as caught:
            _Binding(owner, _App(), port)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "already in use" in message
    assert "port=" in message and "port=0 picks a free one" in message
    assert isinstance(caught.value.__cause__, OSError)


def test_the_shared_start_error_is_what_a_busy_port_raises_by_default(owner: LoopThread) -> None:
    class _Default(_Binding):
        _start_error = ServerStartError  # type: ignore[assignment]

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(ServerStartError, match="already in use"):
            _Default(owner, _App(), taken.getsockname()[1])


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class _Forever(_App):
    """``/forever`` on every request, each counted when it is entered."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Semaphore(0)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.waiting.release()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def test_an_orderly_stop_logs_each_cut_request_as_one_warning_line(owner: LoopThread) -> None:
    n = 4
    app = _Forever()
    server = _Server(owner, app, grace=0.1).start()
    # uvicorn's own logger (its records do not reach the root logger), once its
    # config has set it up at the server's start.
    handler = _Records()
    logging.getLogger("uvicorn.error").addHandler(handler)
    uvicorn_records = handler.records
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        replies = [
            pool.submit(httpx.get, f"{server.url}/forever", timeout=BOUND_S) for _ in range(n)
        ]
        for _ in range(n):
            assert app.waiting.acquire(timeout=BOUND_S)
        server.stop()
        for reply in replies:
            reply.result(BOUND_S)
    cut = [r for r in uvicorn_records if "cut short" in r.getMessage()]
    assert len(cut) == n, [r.getMessage() for r in uvicorn_records]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in cut)
    assert all("\n" not in r.getMessage() for r in cut)
    assert not [r for r in uvicorn_records if r.levelno >= logging.ERROR]
    logging.getLogger("uvicorn.error").removeHandler(handler)
    # Outside serving, uvicorn's logger is as it was.
    assert not logging.getLogger("uvicorn.error").filters
