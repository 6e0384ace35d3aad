"""loopbridge: objects that belong to one event loop, used safely and fast from anywhere.

Decorate a class with :func:`loop_affine` (or :func:`adopt` an instance of a class
you don't own); its instances belong to one asyncio loop.  :func:`proxy` gives a
view that is safe from any thread or loop, with the same types; :func:`blocking`
gives the face for plain threads.

This module is the core.  Observability (counters, latency histograms, loop lag,
hang dumps, Prometheus) lives in :mod:`loopbridge.metrics`; the affinity
sanitizer in :mod:`loopbridge.sanitizer`.
"""

from __future__ import annotations

import os as _os

from ._affinity import set_affinity_check
from ._blocking import Blocking, blocking
from ._declare import adopt, loop_affine, owner_loop, transfer
from ._errors import LoopAffinityError, OwnerLoopClosed, UnsupportedRuntime
from ._loop_thread import LoopThread
from ._proxy import is_proxy, proxy, read_ahead, unwrap
from ._public import publish as _publish
from ._returns import Owned
from ._streams import BlockingStream

__all__ = [
    "loop_affine",
    "adopt",
    "owner_loop",
    "transfer",
    "Owned",
    "proxy",
    "blocking",
    "read_ahead",
    "is_proxy",
    "unwrap",
    "LoopThread",
    "set_affinity_check",
    "LoopAffinityError",
    "OwnerLoopClosed",
    "UnsupportedRuntime",
    "Blocking",
    "BlockingStream",
]
_publish(__name__, globals(), __all__)

# LOOPBRIDGE_SANITIZE=raise|warn|log turns the sanitizer on for the whole process
# (and its Python children).  Unset, the sanitizer is not even imported.
if _os.environ.get("LOOPBRIDGE_SANITIZE"):
    from .sanitizer import install_from_env as _install_from_env

    _install_from_env()
