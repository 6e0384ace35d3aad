"""loopbridge: objects that belong to one event loop, used safely and fast from anywhere.

Decorate a class with :func:`loop_affine` (or :func:`adopt` an instance of a class
you don't own); its instances belong to one asyncio loop.  :func:`proxy` gives a
view that is safe from any thread or loop, with the same types; :func:`blocking`
gives the face for plain threads.
"""

from __future__ import annotations

from ._errors import LoopAffinityError, OwnerLoopClosed
from ._loop_thread import LoopThread
from ._metrics import snapshot as metrics_snapshot
from ._ownership import adopt, loop_affine, owner_loop, set_affinity_check, transfer
from ._proxy import Blocking, blocking, proxy, stats_of
from ._sanitizer import SanitizerError, SanitizerReport, SanitizerWarning, sanitize
from ._sanitizer import install as install_sanitizer
from ._sanitizer import uninstall as uninstall_sanitizer
from ._streams import BlockingStream

__all__ = [
    "Blocking",
    "BlockingStream",
    "SanitizerError",
    "SanitizerReport",
    "SanitizerWarning",
    "install_sanitizer",
    "sanitize",
    "uninstall_sanitizer",
    "LoopAffinityError",
    "LoopThread",
    "OwnerLoopClosed",
    "adopt",
    "blocking",
    "loop_affine",
    "metrics_snapshot",
    "owner_loop",
    "proxy",
    "set_affinity_check",
    "stats_of",
    "transfer",
]

# LOOPBRIDGE_SANITIZE=raise|warn|log turns the sanitizer on for the whole process
# (and its Python children); unset, nothing is patched.
from . import _sanitizer as _san  # noqa: E402

_san.install_from_env()
