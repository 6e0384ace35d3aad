"""The threaded servers' sockets and loops (loopbridge_adapters.http), engine aside.

Accepted connections have TCP_NODELAY: Nagle's algorithm holds back a small second
segment until the first is acknowledged, and a client delays its ACK by about 40 ms,
so a response written in two pieces on a kept-alive connection would wait 40 ms.
asyncio disables Nagle only on sockets whose protocol says TCP, so the listening
socket must be created with ``IPPROTO_TCP``; uvloop disables it on every TCP
connection. (The latency this costs is measured against a real engine's server in
tests/vllm/test_server_socket.py.)
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.listeners import protocol_zero_bind
from loopbridge_adapters.http import adopt_listener, bind, bind_unix, loop_factory, loop_kind


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
    if use_uvloop:
        uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(_accepted_nodelay(bind)) != 0
    finally:
        loop.close()


def test_protocol_zero_listener_leaves_nagle_on_under_asyncio() -> None:
    # The old listener, for contrast: the check above fails on it.
    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(_accepted_nodelay(protocol_zero_bind)) == 0
    finally:
        loop.close()


def test_an_adopted_protocol_zero_listener_gets_tcp_nodelay() -> None:
    sock = adopt_listener(protocol_zero_bind("127.0.0.1", 0))
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert not sock.getblocking()
    finally:
        sock.close()


def test_adopting_anything_but_a_stream_listener_is_refused() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
        pytest.raises(ValueError, match="listening TCP or Unix socket"),
    ):
        adopt_listener(udp)


def test_a_busy_port_fails_at_once_and_leaks_no_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[socket.socket] = []
    real = socket.socket

    def recording(*args: object) -> socket.socket:
        sock = real(*args)  # type: ignore[call-overload]
        made.append(sock)
        return sock

    taken = bind("127.0.0.1", 0)
    try:
        monkeypatch.setattr(socket, "socket", recording)
        with pytest.raises(OSError) as info:
            bind("127.0.0.1", taken.getsockname()[1])
        assert info.value.errno == errno.EADDRINUSE
        [failed] = made
        assert failed.fileno() == -1  # closed, not left to the garbage collector
    finally:
        taken.close()


def test_a_unix_listener_listens_and_a_bad_path_leaks_no_socket(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    sock = bind_unix(str(path))
    try:
        assert path.is_socket() and not sock.getblocking()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # listening already: the backlog holds it
    finally:
        sock.close()
    with pytest.raises(OSError):
        bind_unix(str(tmp_path / "no-such-folder" / "s.sock"))


def test_loop_kind_names_the_implementation() -> None:
    loop = asyncio.new_event_loop()
    try:
        assert loop_kind(loop) == "asyncio"
    finally:
        loop.close()
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        assert loop_kind(loop) == "uvloop"
    finally:
        loop.close()


def test_the_deprecated_loop_factory_warns_and_keeps_its_choice() -> None:
    """True: uvloop when installed, never an error; False: asyncio's (as it always did)."""
    with pytest.warns(DeprecationWarning, match="pass use_uvloop to loopbridge.LoopThread"):
        assert loop_factory(False) is asyncio.new_event_loop
    with pytest.warns(DeprecationWarning):
        loop = loop_factory(True)()
    try:
        try:
            import uvloop
        except ImportError:
            assert isinstance(loop, asyncio.BaseEventLoop)  # not installed: asyncio
        else:
            assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
