"""Member kinds: every member of a loop-affine class, special methods included, is
classified from the class itself (never from a hand-written list), so a member
added in a later version of the class is covered automatically.
"""

from __future__ import annotations

import enum
import inspect
import types
from typing import Any

from ._affinity import original
from ._errors import LoopAffinityError
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
    AWAIT = "awaitable"  # a sync __await__: awaiting the object, marshalled
    # A member with a returns rule (see _returns): its result comes back as a proxy.
    OWNED_CALL = "async method returning an owned object"
    OWNED_STREAM = "async generator yielding owned objects"
    PENDING = "sync method returning an owned object"  # the call runs on the owner
    OWNED_ATTR = "data member holding an owned object"  # read directly, value proxied


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
    sync ``__aiter__`` makes the object's own async iteration a stream, a sync
    ``__await__`` makes awaiting the object a call, a member with a ``returns``
    rule gives back a proxy (see :mod:`loopbridge._returns`), and any other
    special *method* is refused unless declared (Python calls it on the
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


#: Special methods of C types (``deque.__len__``, ``Future.__await__``): methods
#: too, so they are marshalled or refused like functions, never inherited.
_C_METHODS = (types.WrapperDescriptorType, types.MethodDescriptorType)


def _dunder_kind(name: str, raw: Any, ownership: Ownership) -> MemberKind | None:
    if name in PROXY_OWNED_DUNDERS or isinstance(raw, (staticmethod, classmethod)):
        return None
    fn = original(raw)
    if not (inspect.isfunction(fn) or isinstance(fn, _C_METHODS)):
        return None  # data, a slot or dict descriptor, __hash__ = None
    if name == "__aiter__" and name in ownership.returns:
        raise LoopAffinityError(
            "returns={'__aiter__': ...}: a rule for what async iteration yields is given "
            "as returns={'__anext__': ...}"
        )
    if name == "__aiter__" and not _is_async(fn):
        return _declared(name, ownership) or MemberKind.ITERATION
    if name == "__await__" and not _is_async(fn):
        return _declared(name, ownership) or MemberKind.AWAIT
    return _kind(name, raw, ownership)


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def _declared(name: str, ownership: Ownership) -> MemberKind | None:
    if name in ownership.stable:
        return MemberKind.STABLE
    if name in ownership.threadsafe:
        return MemberKind.THREADSAFE
    return None


def _kind(name: str, raw: Any, ownership: Ownership) -> MemberKind:
    fn = original(raw)
    declared = _declared(name, ownership)
    if name in ownership.returns:
        return _owned_kind(name, raw, fn, declared)
    if declared is not None:
        return declared
    if isinstance(raw, (staticmethod, classmethod)):
        return MemberKind.CLASS_LEVEL
    if inspect.isasyncgenfunction(fn):
        return MemberKind.STREAM
    if inspect.iscoroutinefunction(fn):
        return MemberKind.ASYNC
    if inspect.isfunction(fn) or hasattr(raw, "__get__"):
        return MemberKind.SYNC
    return MemberKind.CLASS_LEVEL


def _owned_kind(name: str, raw: Any, fn: Any, declared: MemberKind | None) -> MemberKind:
    """The kind of a member that has a ``returns`` rule; a rule that can't apply is an error."""
    if declared is not None:
        raise LoopAffinityError(
            f"{name!r} is declared {declared.value} and also has a returns rule; a member "
            "is one or the other (a returns rule already says how it crosses threads)"
        )
    if isinstance(raw, (staticmethod, classmethod)):
        raise LoopAffinityError(
            f"returns={{{name!r}: ...}}: {name} is a {type(raw).__name__}, which does not "
            "act on the object; give the rule to the members of the object it returns"
        )
    if inspect.isasyncgenfunction(fn):
        return MemberKind.OWNED_STREAM
    if inspect.iscoroutinefunction(fn):
        return MemberKind.OWNED_CALL
    if inspect.isfunction(fn):
        return MemberKind.PENDING
    return MemberKind.OWNED_ATTR
