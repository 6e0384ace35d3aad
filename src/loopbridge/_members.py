"""Member kinds: every member of a loop-affine class, special methods included, is
classified from the class itself (never from a hand-written list), so a member
added in a later version of the class is covered automatically.
"""

from __future__ import annotations

import enum
import inspect
import types

from ._affinity import original
from ._errors import LoopAffinityError
from ._ownership import Ownership

__all__ = [
    "MemberKind",
    "classify",
    "PROXY_OWNED_DUNDERS",
    "Refused",
    "refused_member",
    "refusal",
    "is_special",
    "loop_bound_result",
]


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


def classify(cls: type, ownership: Ownership) -> dict[str, tuple[MemberKind, object]]:
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
    out: dict[str, tuple[MemberKind, object]] = {}
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


def _dunder_kind(name: str, raw: object, ownership: Ownership) -> MemberKind | None:
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


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def _declared(name: str, ownership: Ownership) -> MemberKind | None:
    if name in ownership.stable:
        return MemberKind.STABLE
    if name in ownership.threadsafe:
        return MemberKind.THREADSAFE
    return None


def _kind(name: str, raw: object, ownership: Ownership) -> MemberKind:
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


def _owned_kind(name: str, raw: object, fn: object, declared: MemberKind | None) -> MemberKind:
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


# ------------------------------------------------------------------ refusals
# What a proxy refuses, and the advice its error gives.
#
# A sync member nobody declared is refused through a proxy.  The error says what
# to declare, and the advice must not cause the bug it guards against: for a
# member whose result is bound to the owner loop (it wraps an async function, as
# ``@asynccontextmanager`` and aiosqlite's ``execute`` do, or is annotated to
# return an awaitable or an async context manager), ``stable`` or ``threadsafe``
# would run it on the calling thread and its result on the calling loop, so the
# advice there is ``returns=`` only.
#
# Special methods are refused by a *method* that raises when called, not by an
# attribute that raises when looked up: CPython's operator slots (``==``, ``<``,
# ``hash()``, ``iter()``) swallow an error raised by the lookup and fall back to
# their default (``False``, "unhashable", "not iterable"), so only a method makes
# the operator itself raise.

_DECLARE = "(in @loop_affine(...) or adopt(...))"

#: Words in a return annotation that say the result belongs to a loop.
_ASYNC_WORDS = (
    "Awaitable",
    "Coroutine",
    "AsyncIterator",
    "AsyncIterable",
    "AsyncGenerator",
    "AsyncContextManager",
    "Future",
    "Task",
)


def is_special(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def loop_bound_result(raw: object) -> str | None:
    """Why the sync member ``raw`` seems to give back an object bound to the owner loop."""
    fn = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
    seen = 0
    f = fn
    while f is not None and seen < 8:  # a decorator's wrapper around an async function
        if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f):
            return f"it wraps the async function {getattr(f, '__qualname__', f)!s}"
        f = getattr(f, "__wrapped__", None)
        seen += 1
    try:
        ann = inspect.get_annotations(fn).get("return") if callable(fn) else None
    except Exception:  # not a function with annotations
        ann = None
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", None) or repr(ann)
    if ann is not None and any(w in text for w in _ASYNC_WORDS):
        return f"it is annotated to return {text}"
    return None


def refusal(cls_name: str, name: str, raw: object = None, how: str = "") -> LoopAffinityError:
    """The error for touching the undeclared sync member ``name`` through a proxy.

    ``raw``: the class attribute, to tell a member whose result is loop-bound;
    ``how``: what else is known (a member made by ``__getattr__``).
    """
    returns = f"returns={{{name!r}: loopbridge.Owned()}}"
    why = loop_bound_result(raw) if raw is not None else None
    if why is not None:
        return LoopAffinityError(
            f"{cls_name}.{name} is a sync member whose result belongs to the owner loop "
            f"({why}), so the proxy refuses it. Declare {returns} {_DECLARE}: the call then "
            "runs on the owner when its result is first awaited, entered or iterated. Do not "
            "declare it stable or threadsafe: that would run it, and its result, on the "
            "calling thread's loop."
        )
    if is_special(name):
        return LoopAffinityError(
            f"{cls_name}.{name} is a sync special method: Python would run it on the calling "
            "thread, off the owner loop, so the proxy refuses it. Call an async method that "
            f"does the same work on the owner, or, if {name} touches no loop-bound state, "
            f"declare it threadsafe=({name!r},) {_DECLARE}."
        )
    return LoopAffinityError(
        f"{cls_name}.{name} is a sync member{how} and is not declared safe from other "
        "threads, so the proxy refuses it. If what it gives back is bound to the owner loop "
        "(an awaitable, an async context manager or iterator, a connection), declare "
        f"{returns} {_DECLARE}. Otherwise, if it is set once at setup and only read, declare "
        f"it stable=({name!r},); if it may be called from any thread, declare it "
        f"threadsafe=({name!r},). Never declare a loop-bound one stable or threadsafe: it "
        "would then run on the calling thread's loop."
    )


class Refused:
    """A sync member nobody declared safe: touching it through a proxy is an error."""

    __slots__ = ("name", "owner_name", "raw")

    def __init__(self, name: str, owner_name: str, raw: object) -> None:
        self.name = name
        self.owner_name = owner_name
        self.raw = raw

    def __get__(self, obj: object, objtype: object = None) -> object:
        if obj is None:
            return self
        raise refusal(self.owner_name, self.name, self.raw)

    def __set__(self, obj: object, value: object) -> None:
        raise refusal(self.owner_name, self.name, self.raw)


def refused_member(cls_name: str, name: str, raw: object) -> object:
    """A refused member: a raising method for a special method, else a :class:`Refused`."""
    if not is_special(name):
        return Refused(name, cls_name, raw)

    def refused(self: object, *args: object, **kwargs: object) -> object:
        raise refusal(cls_name, name, raw)

    refused.__name__ = name
    refused.__qualname__ = f"{cls_name}.{name}"
    refused.__loopbridge_refused__ = True  # type: ignore[attr-defined]
    return refused
