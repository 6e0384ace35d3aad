"""Callers under trio (directly, or through anyio's trio backend).

A trio run gets a :class:`~loopbridge._ports.Port` like any asyncio loop; its
thread-safe doorway is the run's ``TrioToken.run_sync_soon``.  The port lives in a
``RunVar``, so it goes away with the run.
"""

from __future__ import annotations

from typing import Any

from ._ports import Port

__all__ = ["trio_port", "current_library"]

_run_var: Any = None


def current_library() -> str | None:
    try:
        import sniffio
    except ImportError:  # pragma: no cover - anyio depends on sniffio
        return None
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def trio_port() -> Port:
    """The port of the current trio run (created on first use)."""
    global _run_var
    import trio

    if _run_var is None:
        _run_var = trio.lowlevel.RunVar("loopbridge_port")
    try:
        port: Port = _run_var.get()
    except LookupError:
        token = trio.lowlevel.current_trio_token()
        port = Port(token, token.run_sync_soon, f"trio run 0x{id(token):x}")
        port.ran = True
        _run_var.set(port)
    return port
