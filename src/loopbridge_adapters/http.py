"""What a threaded engine server needs, whichever engine: sockets, loop, uvicorn.

* :func:`bind` / :func:`bind_unix` - a listening socket, bound before the server
  thread starts, so a busy port fails the caller at once and clients that connect
  early wait in the backlog instead of being refused;
* :func:`adopt_listener` - a caller's own listening socket, made ready to serve;
* :func:`loop_kind` - which implementation a loop is, for logs and reports;
* :func:`thread_server_class` - uvicorn's ``Server`` for a non-main thread: it installs
  no signal handlers and reports when it accepts connections;
* :class:`ExitReason` - why a server stopped by itself.

Invariants: every TCP listener and every connection it accepts has TCP_NODELAY (Nagle
meets the client's delayed ACK on kept-alive connections otherwise: +40 ms per
request); a socket that fails to bind or listen is closed, never leaked.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import warnings
from collections.abc import Callable, Generator
from typing import Any

__all__ = [
    "ExitReason",
    "adopt_listener",
    "bind",
    "bind_unix",
    "loop_kind",
    "thread_server_class",
]


class ExitReason(str, enum.Enum):
    """Why a threaded server stopped by itself (a stop that was asked for leaves
    ``exit_reason`` None)."""

    ENGINE_DIED = "engine died"
    #: The engine was shut down on purpose while the server still served.
    ENGINE_SHUT_DOWN = "the engine was shut down"
    OWNER_LOOP_STOPPED = "the engine's owner loop stopped"


def bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (0: a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: accepted sockets inherit the protocol, and asyncio
    # sets TCP_NODELAY only on sockets that say they are TCP.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return _listening(sock, (host, port))


def bind_unix(path: str) -> socket.socket:
    """A listening Unix socket at ``path``."""
    return _listening(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), path)


def _listening(sock: socket.socket, address: Any) -> socket.socket:
    """``sock`` bound to ``address`` and listening, non-blocking; closed if that fails."""
    try:
        sock.bind(address)
        # Listen at once: clients that connect before uvicorn runs wait in the
        # backlog instead of being refused.
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def adopt_listener(sock: socket.socket) -> socket.socket:
    """The caller's listening TCP or Unix socket, non-blocking, TCP_NODELAY set."""
    families = (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX)
    if sock.type != socket.SOCK_STREAM or sock.family not in families:
        raise ValueError(f"sock must be a listening TCP or Unix socket, not {sock!r}")
    if sock.family != socket.AF_UNIX:
        # The caller's socket may have been made with protocol 0, for which
        # asyncio leaves Nagle on (see bind). Linux copies TCP_NODELAY from
        # the listener to the connections it accepts.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    return sock


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"``: which implementation ``loop`` is, for logs and reports."""
    return "uvloop" if type(loop).__module__.partition(".")[0] == "uvloop" else "asyncio"


def loop_factory(use_uvloop: bool) -> Callable[[], asyncio.AbstractEventLoop]:
    """Deprecated: ``loopbridge.LoopThread(use_uvloop=None)`` (uvloop when installed) for
    ``True``, ``use_uvloop=False`` for ``False``; the loop's kind is the loop thread's choice."""
    warnings.warn(
        "loopbridge_adapters.http.loop_factory() is deprecated: pass use_uvloop to "
        "loopbridge.LoopThread (None: uvloop when installed; False: asyncio's loop)",
        DeprecationWarning,
        stacklevel=2,
    )
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            return asyncio.new_event_loop
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def thread_server_class() -> type[Any]:
    """uvicorn's ``Server`` for a non-main thread, with an ``on_started`` callback."""
    import uvicorn

    class _ThreadServer(uvicorn.Server):
        on_started: Callable[[], None] = staticmethod(lambda: None)

        # Signal handlers can only be installed on the main thread; whoever
        # owns the process decides what a signal means and stops the server.
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                self.on_started()

    return _ThreadServer
