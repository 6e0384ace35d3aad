"""What a proxy refuses, and the advice its error gives.

A sync member nobody declared is refused through a proxy.  The error says what
to declare, and the advice must not cause the bug it guards against: for a
member whose result is bound to the owner loop (it wraps an async function, as
``@asynccontextmanager`` and aiosqlite's ``execute`` do, or is annotated to
return an awaitable or an async context manager), ``stable`` or ``threadsafe``
would run it on the calling thread and its result on the calling loop, so the
advice there is ``returns=`` only.

Special methods are refused by a *method* that raises when called, not by an
attribute that raises when looked up: CPython's operator slots (``==``, ``<``,
``hash()``, ``iter()``) swallow an error raised by the lookup and fall back to
their default (``False``, "unhashable", "not iterable"), so only a method makes
the operator itself raise.
"""

from __future__ import annotations

import inspect
from typing import Any

from ._errors import LoopAffinityError

__all__ = ["Refused", "refused_member", "refusal", "is_special", "loop_bound_result"]

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


def loop_bound_result(raw: Any) -> str | None:
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


def refusal(cls_name: str, name: str, raw: Any = None, how: str = "") -> LoopAffinityError:
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

    def __init__(self, name: str, owner_name: str, raw: Any) -> None:
        self.name = name
        self.owner_name = owner_name
        self.raw = raw

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        raise refusal(self.owner_name, self.name, self.raw)

    def __set__(self, obj: Any, value: Any) -> None:
        raise refusal(self.owner_name, self.name, self.raw)


def refused_member(cls_name: str, name: str, raw: Any) -> Any:
    """A refused member: a raising method for a special method, else a :class:`Refused`."""
    if not is_special(name):
        return Refused(name, cls_name, raw)

    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise refusal(cls_name, name, raw)

    refused.__name__ = name
    refused.__qualname__ = f"{cls_name}.{name}"
    refused.__loopbridge_refused__ = True  # type: ignore[attr-defined]
    return refused
