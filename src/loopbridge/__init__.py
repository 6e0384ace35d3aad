"""loopbridge: objects that belong to one event loop, used safely and fast from anywhere.

Decorate a class with :func:`loop_affine` (or :func:`adopt` an instance of a class
you don't own); its instances belong to one asyncio loop.  :func:`proxy` gives a
view that is safe from any thread or loop, with the same types; :func:`blocking`
gives the face for plain threads.
"""

from __future__ import annotations

from ._diagnose import dump_inflight, format_inflight, install_hang_dump, record_submission_sites
from ._errors import LoopAffinityError, OwnerLoopClosed
from ._lag import LagMonitor, monitor_lag
from ._loop_thread import LoopThread
from ._metrics import snapshot as metrics_snapshot
from ._ownership import adopt, loop_affine, owner_loop, set_affinity_check, transfer
from ._proxy import Blocking, blocking, is_proxy, proxy, stats_of, unwrap
from ._sanitizer import SanitizerError, SanitizerReport, SanitizerWarning, sanitize
from ._sanitizer import install as install_sanitizer
from ._sanitizer import uninstall as uninstall_sanitizer
from ._streams import BlockingStream

__all__ = [
    "Blocking",
    "BlockingStream",
    "LagMonitor",
    "LoopAffinityError",
    "LoopThread",
    "OwnerLoopClosed",
    "SanitizerError",
    "SanitizerReport",
    "SanitizerWarning",
    "adopt",
    "blocking",
    "dump_inflight",
    "format_inflight",
    "install_hang_dump",
    "install_sanitizer",
    "is_proxy",
    "loop_affine",
    "metrics_snapshot",
    "monitor_lag",
    "owner_loop",
    "proxy",
    "record_submission_sites",
    "sanitize",
    "set_affinity_check",
    "stats_of",
    "transfer",
    "uninstall_sanitizer",
    "unwrap",
]

# LOOPBRIDGE_SANITIZE=raise|warn|log turns the sanitizer on for the whole process
# (and its Python children); unset, nothing is patched.
from . import _sanitizer as _san

_san.install_from_env()
