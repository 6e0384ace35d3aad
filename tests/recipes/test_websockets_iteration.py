"""A real websockets connection, iterated through a proxy: nothing read ahead.

A websocket client connection is async-iterable (websockets' ``__aiter__`` is an
async generator function that yields ``await self.recv()``), and it stays in use
after a consumer breaks out of ``async for``: the next ``recv()`` must get the
next message, as natively.  Iterating a proxied connection must therefore take
one message per request from it and read nothing ahead, whatever the stream
window, from another loop, from a plain thread and from trio.

On 45500bb the async generator ``__aiter__`` took the batched generator path: the
pump read every message already received ahead of the consumer, and after a
``break`` the next ``recv()`` got a later message (the ones in between lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import loopbridge as lb
import loopbridge.metrics

from .conftest import run_in

websockets = pytest.importorskip(
    "websockets", reason="websockets is not installed (dependency group: recipes)"
)
from websockets.asyncio.client import ClientConnection, connect  # noqa: E402
from websockets.asyncio.server import serve  # noqa: E402

#: Messages the server sends at once, before the client iterates.
N = 60
#: How many messages each round takes before breaking out; the round then recv()s one.
ROUNDS = (1, 2, 5, 3, 1, 4)


class Server:
    """A websockets server on loopback, on its own loop thread: each connection is
    sent ``N`` messages, then a ping, whose pong proves the client has every
    message queued before the test starts iterating."""

    def __init__(self) -> None:
        self.thread = lb.LoopThread("ws-server").start()
        self.sent = threading.Event()
        self.url = self.thread.run(self._start)

    async def _start(self) -> str:
        self.server = await serve(self._handler, "127.0.0.1", 0)
        port = next(iter(self.server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}"

    async def _handler(self, ws: Any) -> None:
        for i in range(N):
            await ws.send(f"m{i}")
        await (await ws.ping())  # answered once the client has read every message
        self.sent.set()
        await ws.wait_closed()

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.server.wait_closed()

        self.thread.run(stop)
        self.thread.stop()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.close()


@contextlib.contextmanager
def connection(owner: lb.LoopThread, server: Server, window: int) -> Iterator[Any]:
    """A client connection owned by ``owner``, every message received, as a proxy."""

    async def open_() -> Any:
        # max_queue=None: the client reads all N messages (and the ping) at once.
        return lb.adopt(await connect(server.url, max_queue=None))

    ws = owner.run(open_)
    assert server.sent.wait(10), "the client never answered the server's ping"
    try:
        yield lb.proxy(ws, stream_window=window)
    finally:
        owner.run(ws.close)


async def _rounds_async(p: Any) -> list[tuple[list[str], str]]:
    out = []
    for k in ROUNDS:
        got: list[str] = []
        async for m in p:
            got.append(m)
            if len(got) == k:
                break
        out.append((got, await p.recv()))
    return out


def _rounds_blocking(p: Any) -> list[tuple[list[str], str]]:
    b = lb.blocking(p)
    out = []
    for k in ROUNDS:
        got: list[str] = []
        for m in b:
            got.append(m)
            if len(got) == k:
                break
        out.append((got, b.recv()))
    return out


def _expected() -> list[tuple[list[str], str]]:
    out, n = [], 0
    for k in ROUNDS:
        out.append(([f"m{i}" for i in range(n, n + k)], f"m{n + k}"))
        n += k + 1
    return out


def test_the_connections_iteration_is_an_async_generator_function() -> None:
    """What makes websockets the case: its ``__aiter__`` is an async generator function."""
    assert inspect.isasyncgenfunction(ClientConnection.__aiter__)


@pytest.mark.parametrize("window", [1, 256])
@pytest.mark.parametrize("caller", ["asyncio", "trio", "thread"])
def test_break_then_recv_gets_the_next_message(
    owner: lb.LoopThread, server: Server, caller: str, window: int
) -> None:
    with connection(owner, server, window) as p:
        if caller == "thread":
            got = _rounds_blocking(p)
        else:
            got = run_in(caller, _rounds_async, p)
        assert got == _expected()
        taken = sum(k + 1 for k in ROUNDS)

        async def rest() -> list[str]:
            ws = lb.unwrap(p)
            return [await ws.recv() for _ in range(N - taken)]

        # Every other message is still in the connection, in order.
        assert owner.run(rest) == [f"m{i}" for i in range(taken, N)]
        assert lb.metrics.metrics_of(p).snapshot()["stream_items_unread"] == 0


def test_break_then_recv_from_other_loops_repeatedly(owner: lb.LoopThread, server: Server) -> None:
    """The same connection, iterated by turns from two loops on two threads."""
    with connection(owner, server, 256) as p:
        done: list[list[tuple[list[str], str]]] = []
        first = threading.Thread(target=lambda: done.append(asyncio.run(_rounds_async(p))))
        first.start()
        first.join(30)
        second: list[tuple[list[str], str]] = asyncio.run(_rounds_async(p))
        taken = sum(k + 1 for k in ROUNDS)
        shifted = [
            ([f"m{int(m[1:]) + taken}" for m in got], f"m{int(nxt[1:]) + taken}")
            for got, nxt in _expected()
        ]
        assert done == [_expected()] and second == shifted
