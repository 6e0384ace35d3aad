"""Callers under trio (directly, or through anyio's trio backend).

A trio run gets a :class:`~loopbridge._ports.Port` like any asyncio loop; its
thread-safe doorway is the run's ``TrioToken.run_sync_soon``.  The port lives in a
``RunVar``, so it goes away with the run.  Only trio's public ``trio.lowlevel``
API is used.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

from ._ports import Port

if TYPE_CHECKING:
    import trio

__all__ = ["trio_port", "in_trio_run"]

_run_var: trio.lowlevel.RunVar[Port] | None = None


def in_trio_run() -> bool:
    """Whether this thread is inside a trio run.

    Asked only when no asyncio loop runs here.  A process that never imported
    trio cannot be in a trio run, so trio is not imported to find out.
    """
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True


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
        port.thread_id = threading.get_ident()
        _run_var.set(port)
    return port
