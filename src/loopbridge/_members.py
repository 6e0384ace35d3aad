"""Member kinds: every member of a loop-affine class, special methods included, is
classified from the class itself (never from a hand-written list), so a member
added in a later version of the class is covered automatically.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any

from ._affinity import original
from ._ownership import Ownership

__all__ = ["MemberKind", "classify", "PROXY_OWNED_DUNDERS"]


class MemberKind(enum.Enum):
    ASYNC = "async method"  # marshalled call
    STREAM = "async generator"  # marshalled stream
    ITERATION = "async iteration"  # a sync __aiter__: the object's iteration, streamed
    STABLE = "stable"  # read directly from any thread (declared)
    THREADSAFE = "thread-safe"  # called directly from any thread (declared)
    CLASS_LEVEL = "class-level"  # staticmethod, classmethod, class constant
    SYNC = "sync"  # refused through a proxy


#: Special methods the proxy class defines itself (how a proxy is built, shown,
#: pickled and how its attributes are looked up), whatever the class defines.
PROXY_OWNED_DUNDERS = frozenset(
    {
        "__init__",
        "__new__",
        "__del__",
        "__repr__",
        "__getattr__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__reduce__",
        "__reduce_ex__",
        "__init_subclass__",
        "__class_getitem__",
        "__subclasshook__",
    }
)


def classify(cls: type, ownership: Ownership) -> dict[str, tuple[MemberKind, Any]]:
    """Every member of ``cls`` (MRO order, first definition wins) with its kind.

    Returns ``{name: (kind, raw)}`` where ``raw`` is the unwrapped function for
    async members and the class attribute otherwise.  Special methods are
    members too: an ``async def __x__`` is marshalled like any async method, a
    sync ``__aiter__`` makes the object's own async iteration a stream, and any
    other special *method* is refused unless declared (Python calls it on the
    caller's thread: ``len(p)``, ``p == q``, ``with p``).  Special attributes
    that are not methods (``__module__``, ``__slots__``, ``__hash__ = None``) and
    those the proxy defines itself (:data:`PROXY_OWNED_DUNDERS`) are left out.
    """
    out: dict[str, tuple[MemberKind, Any]] = {}
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if name in out:
                continue
            if name.startswith("__") and name.endswith("__"):
                kind = _dunder_kind(name, raw, ownership)
                if kind is not None:
                    out[name] = (kind, raw)
                continue
            out[name] = (_kind(name, raw, ownership), raw)
    return out


def _dunder_kind(name: str, raw: Any, ownership: Ownership) -> MemberKind | None:
    if name in PROXY_OWNED_DUNDERS or isinstance(raw, (staticmethod, classmethod)):
        return None
    fn = original(raw)
    if not inspect.isfunction(fn):
        return None  # data, a slot or dict descriptor, __hash__ = None
    kind = _kind(name, raw, ownership)
    if kind is MemberKind.SYNC and name == "__aiter__":
        return MemberKind.ITERATION
    return kind


def _kind(name: str, raw: Any, ownership: Ownership) -> MemberKind:
    fn = original(raw)
    if name in ownership.stable:
        return MemberKind.STABLE
    if name in ownership.threadsafe:
        return MemberKind.THREADSAFE
    if isinstance(raw, (staticmethod, classmethod)):
        return MemberKind.CLASS_LEVEL
    if inspect.isasyncgenfunction(fn):
        return MemberKind.STREAM
    if inspect.iscoroutinefunction(fn):
        return MemberKind.ASYNC
    if inspect.isfunction(fn) or hasattr(raw, "__get__"):
        return MemberKind.SYNC
    return MemberKind.CLASS_LEVEL
