"""Kept-alive connections answer as fast as new ones (TCP_NODELAY on accepted sockets).

Nagle's algorithm holds back a small second segment until the first is
acknowledged, and a client delays its ACK by about 40 ms: a response written in
two pieces on a kept-alive connection then waits 40 ms. asyncio disables Nagle
only on sockets whose protocol says TCP, so the listening socket must be created
with ``IPPROTO_TCP``; uvloop disables it on every TCP connection.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loopbridge_vllm import OpenAIServer, start_openai_server
from loopbridge_vllm import server as server_module
from loopbridge_vllm.server import _bind, _loop_factory

# A kept-alive request must not cost more than this many times a request on a
# new connection (which pays a TCP handshake but never meets a delayed ACK).
# Without TCP_NODELAY the ratio is about 20 here.
MAX_KEPT_ALIVE_RATIO = 3.0


def _protocol_zero_bind(host: str, port: int) -> socket.socket:
    """The listening socket as it was made before: protocol 0."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def _accepted_nodelay(bind: Callable[[str, int], socket.socket]) -> int:
    """TCP_NODELAY of the server side of one accepted connection on the running loop."""
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    sock = bind("127.0.0.1", 0)
    server = await loop.create_server(Probe, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        value = await asyncio.wait_for(seen, 30)
        writer.close()
        return value
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("use_uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_accepted_connections_have_tcp_nodelay(use_uvloop: bool) -> None:
    loop = _loop_factory(use_uvloop)()
    try:
        if use_uvloop:
            assert type(loop).__module__.startswith("uvloop")
        assert loop.run_until_complete(_accepted_nodelay(_bind)) != 0
    finally:
        loop.close()


def test_protocol_zero_listener_leaves_nagle_on_under_asyncio() -> None:
    # The old listener, for contrast: the check above fails on it.
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(_accepted_nodelay(_protocol_zero_bind)) == 0
    finally:
        loop.close()


def _p50_ratio(url: str, path: str, rounds: int = 25) -> float:
    """p50 of kept-alive requests over p50 of new-connection requests, interleaved."""
    kept: list[float] = []
    fresh: list[float] = []
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        httpx.Client(base_url=url, timeout=30, headers={"Connection": "close"}) as once,
    ):
        client.get(path).raise_for_status()  # open the kept-alive connection
        for _ in range(rounds):
            t0 = time.perf_counter()
            client.get(path).raise_for_status()
            kept.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            once.get(path).raise_for_status()  # a new connection each time
            fresh.append(time.perf_counter() - t0)
    return statistics.median(kept) / statistics.median(fresh)


@pytest.fixture
def protocol_zero_server(engine_proxy: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A server as it was: protocol-0 listener, asyncio loop."""
    monkeypatch.setattr(server_module, "_bind", _protocol_zero_bind)
    server = start_openai_server(engine_proxy, use_uvloop=False, grace=1.0)
    yield server
    server.stop()


def test_kept_alive_latency_matches_a_new_connection(
    shared_server: OpenAIServer, protocol_zero_server: OpenAIServer
) -> None:
    assert type(shared_server.loop).__module__.startswith("uvloop")
    ours = _p50_ratio(shared_server.url, "/version")
    old = _p50_ratio(protocol_zero_server.url, "/version")
    print(f"kept-alive/new-connection p50: ours {ours:.2f}, protocol-0 asyncio {old:.2f}")
    assert old > MAX_KEPT_ALIVE_RATIO  # the check sees the delayed-ACK stall ...
    assert ours < MAX_KEPT_ALIVE_RATIO  # ... and ours does not have it


def test_asyncio_server_loop_is_as_fast_kept_alive(engine_proxy: Any) -> None:
    server = start_openai_server(engine_proxy, use_uvloop=False, grace=1.0)
    try:
        assert isinstance(server.loop, asyncio.BaseEventLoop)
        assert not type(server.loop).__module__.startswith("uvloop")
        ratio = _p50_ratio(server.url, "/version")
        print(f"kept-alive/new-connection p50 on asyncio: {ratio:.2f}")
        assert ratio < MAX_KEPT_ALIVE_RATIO
    finally:
        server.stop()
