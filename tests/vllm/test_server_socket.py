"""Kept-alive connections answer as fast as new ones (TCP_NODELAY on accepted sockets).

Nagle's algorithm holds back a small second segment until the first is
acknowledged, and a client delays its ACK by about 40 ms: a response written in
two pieces on a kept-alive connection then waits 40 ms. asyncio disables Nagle
only on sockets whose protocol says TCP, so the listening socket must be created
with ``IPPROTO_TCP``; uvloop disables it on every TCP connection. That the listener
and its connections have TCP_NODELAY is tests/adapters/test_http.py's; this is what
it saves a real server.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from adapters.listeners import protocol_zero_bind

from loopbridge_vllm import OpenAIServer, start_openai_server

# A kept-alive request must not cost more than this many times a request on a
# new connection (which pays a TCP handshake but never meets a delayed ACK).
# Without TCP_NODELAY the ratio is about 20 here.
MAX_KEPT_ALIVE_RATIO = 3.0


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


class _ProtocolZeroServer(OpenAIServer):
    """The server as it was: it binds its own listener with protocol 0 (a socket given
    with ``sock=`` would be adopted, which sets TCP_NODELAY on it)."""

    def _listen(self, host: str, port: int) -> socket.socket:
        return protocol_zero_bind(host, port)


@pytest.fixture
def protocol_zero_server(engine_proxy: Any) -> Iterator[Any]:
    """A server as it was: protocol-0 listener, asyncio loop."""
    server = _ProtocolZeroServer(engine_proxy, use_uvloop=False, grace=1.0).start()
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
