"""Real servers on loopback for the recipes' tests, and the callers they run.

* ``http_server``: a uvicorn server running a small ASGI app in its own thread
  (listening before the fixture returns: the socket is bound and listening
  first, so connections queue until uvicorn accepts them);
* ``grpc_server``: an in-process ``grpc.aio`` server on its own loop, with
  generic handlers (bytes in, bytes out: no generated code);
* ``owner``: the loop that owns each client, on a ``LoopThread`` (stock asyncio
  and uvloop);
* ``run_in``: runs a coroutine function on a new loop of the given kind
  (asyncio, uvloop, or trio through anyio) in this thread.

The apps record what a cancelled client does to the server (a disconnect, a
cancelled RPC) in ``threading.Event``s that tests wait on.

Every test here runs under the affinity sanitizer in ``raise`` mode (a
``loopbridge_sanitize("raise")`` marker on each test that has none): a client
used off its owner loop anywhere in a recipe, its streaming paths included,
fails the test.  What shows a raw client's race does so in ``sanitize("off")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

import loopbridge as lb

uvicorn = pytest.importorskip(
    "uvicorn", reason="uvicorn is not installed (dependency group: recipes)"
)
T = TypeVar("T")

CALLERS = ["asyncio", "uvloop", "trio"]
_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The recipes' tests run with the sanitizer raising, unless a test says otherwise."""
    for item in items:
        inside = os.path.abspath(str(item.path)).startswith(_HERE + os.sep)
        if inside and item.get_closest_marker("loopbridge_sanitize") is None:
            item.add_marker(pytest.mark.loopbridge_sanitize("raise"))


def run_in(kind: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``fn(*args)`` on a fresh loop of ``kind`` in this thread."""
    if kind == "asyncio":
        return asyncio.run(fn(*args))  # type: ignore[arg-type]
    if kind == "uvloop":
        import uvloop

        return uvloop.run(fn(*args))  # type: ignore[arg-type, no-any-return]
    import anyio

    return anyio.run(fn, *args, backend="trio")


@contextlib.contextmanager
def owner_busy(owner: lb.LoopThread) -> Iterator[None]:
    """The owner loop busy in a callback for the duration of the block.

    The unsafe sharing these tests show is a race between two threads: whether
    it fails depends on whether the owner happens to run while the other loop
    uses the client.  Holding the owner in one callback (as any step of its own
    work would) makes the outcome the same every run.
    """
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        release.wait(60)

    owner.loop.call_soon_threadsafe(hold)
    assert busy.wait(30), "the owner loop never ran the callback"
    try:
        yield
    finally:
        release.set()


@pytest.fixture(params=["asyncio", "uvloop"])
def owner(request: pytest.FixtureRequest) -> Iterator[lb.LoopThread]:
    t = lb.LoopThread(name=f"client-owner-{request.param}", use_uvloop=request.param == "uvloop")
    t.start()
    yield t
    t.stop()


# ----------------------------------------------------------------------- HTTP
class HttpApp:
    """``/json/<n>``, ``/lines/<n>`` (streamed), ``/echo`` (POST JSON back), ``/slow``
    (answers only when the client goes away, and records that)."""

    def __init__(self) -> None:
        self.slow_started = threading.Event()
        self.disconnected = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        path: str = scope["path"]
        if path.startswith("/json/"):
            await self._send(send, {"n": int(path.rsplit("/", 1)[1])})
        elif path == "/echo":
            body = b""
            while True:
                msg = await receive()
                body += msg.get("body", b"")
                if not msg.get("more_body"):
                    break
            await self._send(send, {"echo": json.loads(body)})
        elif path.startswith("/lines/"):
            n = int(path.rsplit("/", 1)[1])
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for i in range(n):
                chunk = f"line {i}\n".encode()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/slow":
            self.slow_started.set()
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
        else:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"not found"})

    @staticmethod
    async def _send(send: Any, payload: Any) -> None:
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class HttpServer:
    def __init__(self) -> None:
        self.app = HttpApp()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        # Keep-alive longer than any stall of a busy CI machine: at uvicorn's default (5 s,
        # httpx's own expiry too) a client may reuse a connection the server is closing at
        # that moment, and the request fails with httpx.ReadError (seen once on 3.10).
        config = uvicorn.Config(
            self.app, lifespan="off", log_level="warning", backlog=1024, timeout_keep_alive=60
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name="uvicorn", daemon=True
        )

    def open_connections(self) -> int:
        return len(self.server.server_state.connections)

    def __enter__(self) -> HttpServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    with HttpServer() as server:
        yield server


# ----------------------------------------------------------------------- gRPC
def _same(b: bytes) -> bytes:
    return b


class GrpcApp:
    """``/demo.Echo/Say`` (unary), ``/demo.Echo/Count`` (server stream of n
    items), ``/demo.Echo/Hang`` (unary, never answers; records its cancel)."""

    def __init__(self) -> None:
        self.hang_started = threading.Event()
        self.hang_cancelled = threading.Event()
        self.count_cancelled = threading.Event()

    async def say(self, request: bytes, context: Any) -> bytes:
        return b"hello " + request

    async def count(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        n = int(request)
        done = False
        try:
            for i in range(n):
                yield str(i).encode()
            done = True
        finally:
            # Stopped before the end: the client cancelled (grpc.aio closes the
            # handler's generator, or cancels its task).
            if not done:
                self.count_cancelled.set()

    async def hang(self, request: bytes, context: Any) -> bytes:
        self.hang_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.hang_cancelled.set()
            raise
        raise AssertionError("unreachable")

    def handler(self) -> Any:
        import grpc

        kw = {"request_deserializer": _same, "response_serializer": _same}
        return grpc.method_handlers_generic_handler(
            "demo.Echo",
            {
                "Say": grpc.unary_unary_rpc_method_handler(self.say, **kw),
                "Count": grpc.unary_stream_rpc_method_handler(self.count, **kw),
                "Hang": grpc.unary_unary_rpc_method_handler(self.hang, **kw),
            },
        )


class GrpcServer:
    def __init__(self) -> None:
        self.app = GrpcApp()
        self.loop = lb.LoopThread(name="grpc-server")
        self.server: Any = None
        self.target = ""

    async def _start(self) -> None:
        import grpc

        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((self.app.handler(),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.target = f"127.0.0.1:{port}"

    async def _stop(self) -> None:
        await self.server.stop(None)

    def __enter__(self) -> GrpcServer:
        self.loop.start()
        self.loop.run(self._start)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.loop.run(self._stop)
        finally:
            self.loop.stop()


@pytest.fixture
def grpc_server() -> Iterator[GrpcServer]:
    pytest.importorskip("grpc", reason="grpcio is not installed (dependency group: recipes)")
    with GrpcServer() as server:
        yield server
