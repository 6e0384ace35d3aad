"""Returned loop-bound objects: the rules that say a member's result belongs to the
owner loop, and the check that catches a result no rule covers.

A rule is an :class:`Owned` value, declared per member
(``adopt(obj, returns={"get": Owned(...)})`` or ``@loop_affine(returns=...)``).
It says: what this member gives back is bound to the owner loop too; hand it to
the caller as a proxy with these declarations (and these rules for *its*
members, so a chain such as ``session.get()`` -> ``__aenter__()`` -> response is
followed all the way).

Invariants:

* Rules are immutable and hashable: a proxy class is generated once per
  (class, declarations, rules) and cached.
* :func:`loop_state` looks at the result and at its own attributes only (one
  level, plus each attribute's ``_loop``), never at containers or deeper: it
  runs on the owner for every non-plain result of a marshalled call, so it must
  stay cheap and must never run user code other than attribute reads of
  ``__dict__`` and ``__slots__``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Protocol

__all__ = ["Owned", "PLAIN", "loop_state", "names", "check_rules"]


def names(value: Iterable[str], what: str) -> frozenset[str]:
    """Member names given as an iterable of strings; a bare string is a mistake."""
    if isinstance(value, str):
        raise TypeError(f"{what} takes a tuple of member names, not the string {value!r}")
    out = frozenset(value)
    for name in out:
        if not isinstance(name, str):
            raise TypeError(f"{what} takes member names (strings), not {name!r}")
    return out


def check_rules(returns: Mapping[str, Owned] | None, what: str) -> dict[str, Owned]:
    """``returns=`` as a plain dict of member name to rule, each checked."""
    if returns is None:
        return {}
    if not isinstance(returns, Mapping):
        raise TypeError(
            f"{what} takes a mapping of member name to loopbridge.Owned(...), not "
            f"{type(returns).__qualname__}"
        )
    out: dict[str, Owned] = {}
    for name, rule in returns.items():
        if not isinstance(name, str):
            raise TypeError(f"{what}: member names are strings, not {name!r}")
        if not isinstance(rule, Owned):
            raise TypeError(
                f"{what}[{name!r}] must be a loopbridge.Owned(...) rule, not "
                f"{type(rule).__qualname__}"
            )
        out[name] = rule
    return out


class Owned:
    """A rule: what a member gives back belongs to the owner loop.

    Through a proxy, the member's result comes back as a proxy of that result,
    owned by the same loop, with these declarations:

    * ``stable``: data members of the result that any thread may read;
    * ``threadsafe``: sync members of the result that any thread may call;
    * ``returns``: rules for the result's own members, by name.  The protocol
      members name what an object gives: ``"__aenter__"`` (``async with``),
      ``"__await__"`` (``await``), ``"__anext__"`` (the items of ``async for``)
      and ``"__call__"``.

    What the rule applies to depends on the member it is declared for:

    * an ``async def`` member: its awaited result;
    * an async generator member (or ``__anext__``): each item;
    * a sync method (``session.get(...)``, ``pool.acquire()``): the call itself
      runs on the owner loop, when the caller first awaits the result, enters it
      with ``async with`` or iterates it with ``async for``;
    * a data member (``stub.SayHello``): it is read directly, like a ``stable``
      one, and its value comes back as a proxy.
    """

    __slots__ = ("stable", "threadsafe", "returns", "_key")

    stable: frozenset[str]
    threadsafe: frozenset[str]
    returns: Mapping[str, Owned]
    _key: tuple[frozenset[str], frozenset[str], frozenset[tuple[str, Owned]]]

    def __init__(
        self,
        *,
        stable: Iterable[str] = (),
        threadsafe: Iterable[str] = (),
        returns: Mapping[str, Owned] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "stable", names(stable, "Owned(stable=...)"))
        set_(self, "threadsafe", names(threadsafe, "Owned(threadsafe=...)"))
        rules = check_rules(returns, "Owned(returns=...)")
        set_(self, "returns", MappingProxyType(rules))  # shared and hashed: read-only
        set_(self, "_key", (self.stable, self.threadsafe, frozenset(rules.items())))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("loopbridge.Owned rules are immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Owned) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        parts = []
        if self.stable:
            parts.append(f"stable={tuple(sorted(self.stable))!r}")
        if self.threadsafe:
            parts.append(f"threadsafe={tuple(sorted(self.threadsafe))!r}")
        if self.returns:
            parts.append(f"returns={dict(self.returns)!r}")
        return f"Owned({', '.join(parts)})"


#: Results that are never loop-bound: skipped with one set lookup.
PLAIN = frozenset(
    {type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set}
    | {frozenset, range, memoryview}
)

_BOUND = (asyncio.AbstractEventLoop, asyncio.Future, asyncio.BaseTransport)


def _bound_kind(value: object) -> str | None:
    if isinstance(value, _BOUND):
        return type(value).__qualname__
    if inspect.iscoroutine(value) or inspect.isasyncgen(value):
        return f"not yet run {type(value).__qualname__}"
    if _binds_a_loop(value):
        # asyncio's Queue, Event, Lock...: _loop is None until first used, then
        # the loop that used it; crossing one unbound binds it to the wrong loop.
        return f"{type(value).__qualname__} (it binds to the first loop that uses it)"
    return None


_loop_classes: dict[type, bool] = {}


def _binds_a_loop(value: object) -> bool:
    """Whether ``value`` keeps a ``_loop`` that is not set yet (``None``): its own, or
    its class's (asyncio's primitives declare ``_loop = None`` on the class)."""
    try:
        d = object.__getattribute__(value, "__dict__")
    except AttributeError:
        d = None
    if type(d) is dict and "_loop" in d:
        return d["_loop"] is None
    cls = type(value)
    found = _loop_classes.get(cls)
    if found is None:
        found = _loop_classes.setdefault(
            cls, any(k.__dict__.get("_loop", 0) is None for k in cls.__mro__)
        )
    return found


def loop_state(obj: object) -> str | None:
    """Where ``obj`` holds loop-bound state, in words, or ``None`` if it shows none.

    Loop-bound: holding an event loop, being or holding a future or task, a
    transport, an unstarted coroutine or async generator (which would run on
    whoever awaits it), or an object with a ``_loop`` (asyncio's primitives,
    streams, and most async clients' objects keep their loop there), set or
    still ``None`` (a fresh Queue or Event binds to the first loop that uses
    it).  Checked for ``obj`` itself and each of its attributes.
    """
    if isinstance(obj, asyncio.AbstractEventLoop):
        return None  # the loop itself: its thread-safe methods are for other threads
    kind = _bound_kind(obj)
    if kind is not None:
        return f"it is a {kind}"
    for name, value in _attributes(obj):
        if type(value) in PLAIN:
            continue
        kind = _bound_kind(value)
        if kind is not None:
            return f"its attribute {name!r} is a {kind}"
        try:
            inner = object.__getattribute__(value, "__dict__")
        except AttributeError:
            continue
        if type(inner) is dict and isinstance(inner.get("_loop"), asyncio.AbstractEventLoop):
            return f"its attribute {name!r} ({type(value).__qualname__}) is bound to a loop"
    return None


def _attributes(obj: object) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    try:
        d = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        d = None
    if type(d) is dict:
        out += d.items()
    for slot, descriptor in _slots(type(obj)):
        try:
            out.append((slot, descriptor.__get__(obj, type(obj))))
        except AttributeError:
            continue  # an unset slot
    return out


class _Slot(Protocol):
    """A slot's descriptor (a ``member_descriptor``, or whatever a class put there)."""

    def __get__(self, obj: object, owner: type, /) -> object: ...


_slot_cache: dict[type, tuple[tuple[str, _Slot], ...]] = {}


def _slots(cls: type) -> tuple[tuple[str, _Slot], ...]:
    """The slot descriptors of ``cls`` and its bases (cached per class)."""
    found = _slot_cache.get(cls)
    if found is None:
        items: list[tuple[str, _Slot]] = []
        for klass in cls.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                descriptor: _Slot | None = klass.__dict__.get(slot)
                if (
                    slot not in ("__dict__", "__weakref__")
                    and descriptor is not None
                    and hasattr(descriptor, "__get__")
                ):
                    items.append((slot, descriptor))
        found = _slot_cache.setdefault(cls, tuple(items))
    return found
