"""The exception types loopbridge raises on its own behalf.

Each names ``loopbridge`` as its module in its class body, not only when
``loopbridge`` exports it (:mod:`loopbridge._public`): ``UnsupportedRuntime``
is raised while ``loopbridge`` itself is still being imported, and its
traceback must say ``loopbridge.UnsupportedRuntime`` too.
"""

from __future__ import annotations

__all__ = ["LoopAffinityError", "OwnerLoopClosed", "UnsupportedRuntime"]


class LoopAffinityError(RuntimeError):
    """An object that belongs to one event loop was used in a way that is unsafe.

    Raised for misuse that would otherwise corrupt the owner's state or deadlock:
    calling a loop-affine object's async member from a loop that does not own it,
    touching a sync member that was not declared stable or thread-safe through a
    proxy, or using the blocking face on the owner loop's own thread.  The message
    always says what to do instead.
    """

    __module__ = "loopbridge"


class OwnerLoopClosed(RuntimeError):
    """The loop that owns the object stopped or closed.

    Every call and stream still waiting on that loop fails with this error, and
    new calls fail at once.  Transfer the object to a running loop with
    :func:`loopbridge.transfer` to use it again.
    """

    __module__ = "loopbridge"


class UnsupportedRuntime(RuntimeError):
    """This Python or event loop lacks something loopbridge's guarantees rest on.

    Raised at import (a process-wide fact, such as a free-threaded build) or when
    loopbridge first talks to a loop (a per-loop fact), never as a silent
    fallback.  The message names what is missing and why it is needed.
    """

    __module__ = "loopbridge"
