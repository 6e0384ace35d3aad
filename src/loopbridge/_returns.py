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
* What an owned object gives back is covered at every depth: a protocol step a
  rule does not name (``"__aenter__"``, ``"__await__"``, ``"__anext__"``) gets
  :data:`INHERITED`, and so does every other result of the object's members
  (the proxy layer reads ``Ownership.inherits``): a result that holds loop-bound
  state anywhere it reaches comes back as a proxy under ``Owned()``, whose own
  results are covered the same way; plain data crosses as it is.
* :func:`loop_state` looks at the result and its own attributes (the
  always-on check of a result no rule covers: it runs on the owner for every
  non-plain result of a marshalled call, so it stays one level); ``deep``, it
  follows attributes (``__dict__`` and ``__slots__``) and the items of
  containers among them, breadth first, up to :data:`BUDGET` objects, each
  once.  It never runs user code other than those reads, and never enters
  classes, modules or functions; beyond the budget it gives up, saying so only
  when asked (``strict``).
"""

from __future__ import annotations

import asyncio
import inspect
import types
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

__all__ = ["Owned", "INHERITED", "PLAIN", "BUDGET", "loop_state", "names", "check_rules"]


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


#: The protocol steps of what an object gives (see :class:`Owned`).
STEPS = frozenset({"__aenter__", "__await__", "__anext__"})


class Steps(Mapping[str, "Owned"]):
    """A rule's ``returns``: read-only; ``get()`` of a protocol step it does not
    name gives :data:`INHERITED` (what an owned object hands back is covered
    too).  Membership, iteration and ``[]`` are the names given."""

    __slots__ = ("_rules",)

    def __init__(self, rules: Mapping[str, Owned]) -> None:
        self._rules = dict(rules)

    def __getitem__(self, name: str) -> Owned:
        return self._rules[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def get(self, name: str, default: object = None) -> Any:
        rule = self._rules.get(name)
        if rule is not None:
            return rule
        return INHERITED if name in STEPS else default

    def __repr__(self) -> str:
        return repr(self._rules)


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

    What the proxy's own members give back, where ``returns`` names no rule, is
    covered too: a proxy under ``Owned()`` when it holds loop-bound state at any
    depth, plain data as it is (:data:`INHERITED`).
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
        # Shared and hashed: read-only; a protocol step it does not name inherits.
        set_(self, "returns", Steps(rules))
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


#: What an owned object gives without a rule of its own naming it: what the
#: object it came from is covered by covers it too (see the module's invariants).
INHERITED = Owned.__new__(Owned)
object.__setattr__(INHERITED, "stable", frozenset())
object.__setattr__(INHERITED, "threadsafe", frozenset())
object.__setattr__(INHERITED, "returns", Steps({}))
object.__setattr__(INHERITED, "_key", ("inherited",))


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


#: How many objects :func:`loop_state` looks at, at most, for one result.
BUDGET = 512

#: Never entered: their attributes are not the result's state.
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)
_CONTAINERS = (list, tuple, set, frozenset, deque)


def loop_state(obj: object, deep: bool = False, strict: bool = False) -> str | None:
    """Where ``obj`` holds loop-bound state, in words, or ``None`` if it shows none.

    Loop-bound: holding an event loop, being or holding a future or task, a
    transport, an unstarted coroutine or async generator (which would run on
    whoever awaits it), an object with a ``_loop`` (asyncio's primitives,
    streams, and most async clients' objects keep their loop there), set or
    still ``None`` (a fresh Queue or Event binds to the first loop that uses
    it), or a loop-affine object.  Checked for ``obj`` and its own attributes
    (the always-on check of a result no rule covers); ``deep``: and everything
    it reaches through attributes and containers, at any depth (an httpx
    response reaches its connection's stream five objects down), up to
    :data:`BUDGET` objects (what an owned object gives back).  ``strict``: a
    result that reaches more than that is reported (nothing was found, but not
    everything was looked at); otherwise ``None``.
    """
    if isinstance(obj, asyncio.AbstractEventLoop):
        return None  # the loop itself: its thread-safe methods are for other threads
    kind = _bound_kind(obj)
    if kind is not None:
        return f"it is a {kind}"
    seen = {id(obj)}
    todo: deque[tuple[str, object]] = deque(_reached("", obj) if deep else _attributes(obj))
    left = BUDGET
    while todo:
        path, value = todo.popleft()
        if type(value) in _SCALARS or id(value) in seen:
            continue
        left -= 1
        if left < 0:
            if strict:
                return f"it reaches more than {BUDGET} objects, too many to look through"
            return None
        seen.add(id(value))
        kind = _held_kind(value)
        if kind is not None:
            where = f"item {path}" if path.startswith("[") else f"attribute {path!r}"
            return f"its {where} is {kind}"
        if deep:
            todo.extend(_reached(path, value))
    return None


#: Plain values that hold nothing: never counted nor entered.
_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, range})
_ATTR_KEY = "__loopbridge_ownership__"  # see _ownership (a layer above this one)


def _held_kind(value: object) -> str | None:
    """``value`` (reached from a result) in words, if it is loop-bound."""
    if isinstance(value, asyncio.AbstractEventLoop):
        return f"an event loop ({type(value).__qualname__})"
    kind = _bound_kind(value)
    if kind is not None:
        return f"a {kind}"
    try:
        inner = object.__getattribute__(value, "__dict__")
    except AttributeError:
        inner = None
    if type(inner) is dict:
        if isinstance(inner.get("_loop"), asyncio.AbstractEventLoop):
            return f"a {type(value).__qualname__} bound to a loop"
        if _ATTR_KEY in inner:
            return f"a loop-affine {type(value).__qualname__}"
    return None


def _reached(path: str, value: object) -> list[tuple[str, object]]:
    """What ``value`` holds: its attributes, or a container's items (by path)."""
    if isinstance(value, _OPAQUE) or getattr(type(value), "__loopbridge_proxy__", False):
        return []  # a proxy crosses as it is: its target is not the result's state
    if isinstance(value, dict):
        return [(f"{path}[{k!r}]", v) for k, v in list(value.items())]
    if isinstance(value, _CONTAINERS):
        return [(f"{path}[{i}]", v) for i, v in enumerate(list(value))]
    return [(f"{path}.{name}" if path else name, v) for name, v in _attributes(value)]


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
