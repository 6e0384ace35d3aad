"""The member-kind table: what each kind of member becomes on each face.

:data:`FACES` maps every :class:`~loopbridge._members.MemberKind` to the builder
of its proxy (awaitable-face) member.  A builder returns that member and, for a
marshalled one, its :class:`Crossing`: what runs on the owner loop and how a
caller waits for it.  The blocking face (:mod:`loopbridge._blocking`) builds its
own members from the crossings alone, so it never inspects what the proxy built.

Invariants:

* one row per member kind, and every row is here: a kind added to
  :class:`MemberKind` without a row fails when the table is built;
* a member has a crossing if and only if it is marshalled (a call, a stream, a
  pending result or awaiting the object); passed-through, refused and inherited
  members have none, so the blocking face hands them through as they are;
* the crossings of a generated class are registered (:func:`register`) before
  the class can be used, and never change afterwards.
"""

from __future__ import annotations

import enum
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from ._affinity import original
from ._calls import route_call, route_exit
from ._codegen import build
from ._members import MemberKind, refused_member
from ._operation import Options
from ._ownership import ON_OWNER, ON_OWNER_LOOP, ON_OWNER_THREAD, Ownership, on_owner_thread
from ._pending import Own, Pending
from ._ports import get_running_loop
from ._returns import Owned
from ._streams import Channel, RemoteStream

__all__ = [
    "FACES",
    "Crossing",
    "Spec",
    "Wait",
    "await_member",
    "channel_maker",
    "crossings_of",
    "forget",
    "register",
    "SEALED",
]


class Wait(enum.Enum):
    """How a caller waits for a marshalled member."""

    CALL = "call"  # one outcome
    STREAM = "stream"  # items, with back-pressure
    PENDING = "pending"  # a result made on the owner when first used
    RESULT = "result"  # awaiting the object itself (the blocking face's ``result()``)


@dataclass(frozen=True)
class Crossing:
    """What a marshalled member runs on the owner loop.

    ``source``: the member's own function (names, docs and signature come from
    it); ``on_owner``: what runs there, called as ``on_owner(target, *args)``, or
    as ``on_owner(target, opts, *args)`` when ``with_opts`` (a member whose result
    is shaped by a rule).  ``ahead``: a stream's read-ahead (None: batched);
    ``rule``: a pending result's.
    """

    wait: Wait
    source: Callable[..., object]
    on_owner: Callable[..., object]
    with_opts: bool = False
    ahead: int | None = None
    rule: Owned | None = None


@dataclass(frozen=True)
class Spec:
    """One member of a class being proxied: what a row of :data:`FACES` builds from."""

    cls: type
    name: str
    raw: object  # the class attribute: a function, a descriptor, a C method, data
    ownership: Ownership
    own: Own  # shapes a result by its rule (loopbridge._proxy.result_by_rule)

    @property
    def fn(self) -> Callable[..., Any]:
        fn: Callable[..., Any] = original(self.raw)
        return fn

    @property
    def rule(self) -> Owned:
        rule: Owned = self.ownership.returns[self.name]
        return rule


#: A row's result: the proxy member (None: inherited as is) and its crossing.
Built = tuple[object, Crossing | None]


# ------------------------------------------------------------ member factories
# One definition of a proxy member, rendered with the method's own signature or,
# when that can't be mirrored, with plain (*args, **kwargs) forwarding: on the
# owner loop it calls straight through; anywhere else route_call decides.
_ASYNC_MEMBER = (
    """
def make({make_params}):
    def member({params}):
        __lb_owner = {self}._lb_ownership.owner
        if """
    + ON_OWNER_THREAD.format(owner="__lb_owner")
    + " or "
    + ON_OWNER_LOOP.format(owner="__lb_owner", loop="__lb_loop := __lb_grl()")
    + """:
            return __lb_fn({self}._lb_target, {args})  # same loop: straight through
        return __lb_route(
            {self}._lb_opts,
            __lb_loop,
            __lb_fn,
            ({self}._lb_target, {positional}),
            {keywords},
            __lb_what,
        )
    return member
"""
)


def _async_member(
    name: str, fn: Callable[..., object], generic: bool = False
) -> Callable[..., object]:
    member = build(
        _ASYNC_MEMBER,
        fn,
        "proxy member",
        generic=generic,
        __lb_fn=fn,
        __lb_ident=threading.get_ident,
        __lb_grl=get_running_loop,
        __lb_route=route_exit if name == "__aexit__" else route_call,
        __lb_what=f"{fn.__qualname__}()",
    )
    return _describe(member, name, fn)


def _describe(
    member: Callable[..., object], name: str, fn: Callable[..., object]
) -> Callable[..., object]:
    member.__name__ = name
    member.__qualname__ = fn.__qualname__
    member.__doc__ = fn.__doc__
    member.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    member.__wrapped__ = fn  # type: ignore[attr-defined]  # inspect.signature follows it
    return member


_STREAM_MEMBER = (
    """
def make({make_params}):
    def member({params}):
        __lb_owner = {self}._lb_ownership.owner
        if """
    + ON_OWNER.format(owner="__lb_owner")
    + """:
            return __lb_fn({self}._lb_target, {args})  # same loop: the real generator
        return __lb_stream(
            __lb_channel(
                __lb_fn, ({self}._lb_target, {positional}), {keywords}, __lb_what, {self}._lb_opts
            )
        )
    return member
"""
)


def _stream_member(
    name: str, fn: Callable[..., object], what: str | None = None, ahead: int | None = None
) -> Callable[..., object]:
    """``ahead``: how far the stream reads ahead of its consumer (None: batched)."""
    member = build(
        _STREAM_MEMBER,
        fn,
        "proxy stream member",
        __lb_fn=fn,
        __lb_ident=threading.get_ident,
        __lb_grl=get_running_loop,
        __lb_stream=RemoteStream,
        __lb_channel=channel_maker(ahead),
        __lb_what=what or f"{fn.__qualname__}()",
    )
    return _describe(member, name, fn)


def channel_maker(ahead: int | None) -> Callable[..., Channel]:
    """How a stream member makes its channel: batched (the plain class), or on demand."""
    return Channel if ahead is None else functools.partial(Channel, ahead=ahead)


async def _iterate(self: AsyncIterator[object]) -> AsyncIterator[object]:
    """The object's own async iteration (its ``__aiter__`` and ``__anext__``), as
    an async generator that a proxy streams: it runs on the owner loop."""
    async for item in self:
        yield item


# ------------------------------------------------- returned loop-bound objects
# Members with a returns rule (see _returns): what they give back is made a
# proxy on the owner loop, by Spec.own, before it crosses.  Plain forwarding is
# enough here: each of these calls crosses threads, which costs far more.
def _generic_parts(self: object) -> tuple[object, Options]:
    get = object.__getattribute__
    return get(self, "_lb_target"), get(self, "_lb_opts")


def _owned_call_member(
    name: str, fn: Callable[..., Awaitable[object]], rule: Owned, own: Own
) -> Built:
    what = f"{fn.__qualname__}()"

    async def on_owner(target: object, opts: Options, /, *args: object, **kwargs: object) -> object:
        return own(await fn(target, *args, **kwargs), rule, what, opts)

    def member(self: object, /, *args: object, **kwargs: object) -> object:
        target, opts = _generic_parts(self)
        if on_owner_thread(opts.ownership):
            return on_owner(target, opts, *args, **kwargs)
        return route_call(opts, get_running_loop(), on_owner, (target, opts, *args), kwargs, what)

    made = _describe(member, name, fn)
    return made, Crossing(Wait.CALL, fn, on_owner, with_opts=True)


def _owned_stream_member(
    name: str,
    fn: Callable[..., AsyncIterator[object]],
    rule: Owned | None,
    what: str,
    ahead: int | None,
    own: Own,
) -> Built:
    async def on_owner(
        target: object, opts: Options, /, *args: object, **kwargs: object
    ) -> AsyncIterator[object]:
        agen = fn(target, *args, **kwargs)
        try:
            async for item in agen:
                yield own(item, rule, what, opts)
        finally:
            await agen.aclose()  # type: ignore[attr-defined]  # closed early: close it here

    def member(self: object, /, *args: object, **kwargs: object) -> object:
        target, opts = _generic_parts(self)
        if on_owner_thread(opts.ownership):
            return on_owner(target, opts, *args, **kwargs)
        ch = Channel(on_owner, (target, opts, *args), kwargs, what, opts, ahead=ahead)
        return RemoteStream(ch)

    made = _describe(member, name, fn)
    return made, Crossing(Wait.STREAM, fn, on_owner, with_opts=True, ahead=ahead)


def _pending_member(name: str, fn: Callable[..., object], rule: Owned, own: Own) -> Built:
    what = f"{fn.__qualname__}()"

    def member(self: object, /, *args: object, **kwargs: object) -> Pending:
        target, opts = _generic_parts(self)
        # Made on the owner loop when first awaited, entered or iterated.
        return Pending(fn, (target, *args), kwargs, rule, opts, what, own)

    return _describe(member, name, fn), Crossing(Wait.PENDING, fn, fn, rule=rule)


def await_member(
    cls: type, raw: Callable[[object], object], rule: Owned | None, own: Own | None
) -> Built:
    """``__await__`` of a proxy (or of an uncovered result, with no rule): awaiting
    the object runs on the owner loop; ``own`` shapes what it gives by ``rule``."""
    what = f"awaiting a {cls.__qualname__} object"

    async def on_owner(target: Awaitable[object], opts: Options) -> object:
        value = await target
        return value if rule is None or own is None else own(value, rule, what, opts)

    def __await__(self: object) -> object:
        target, opts = _generic_parts(self)
        if on_owner_thread(opts.ownership):
            return raw(target)
        return route_call(opts, get_running_loop(), on_owner, (target, opts), {}, what).__await__()

    member = _describe(__await__, "__await__", raw)
    member.__qualname__ = f"{cls.__qualname__}.__await__"
    return member, Crossing(Wait.RESULT, raw, on_owner, with_opts=True)


class _OwnedAttr:
    """A data member with a returns rule: read directly, its value comes back as a proxy."""

    __slots__ = ("name", "rule", "what", "own")

    def __init__(self, name: str, rule: Owned, what: str, own: Own) -> None:
        self.name = name
        self.rule = rule
        self.what = what
        self.own = own

    def __get__(self, obj: object, objtype: type | None = None) -> object:
        if obj is None:
            return self
        target, opts = _generic_parts(obj)
        return self.own(getattr(target, self.name), self.rule, self.what, opts)


class _Passthrough:
    """A declared stable / thread-safe member: read from the target directly."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> object:
        if obj is None:
            return self
        return getattr(object.__getattribute__(obj, "_lb_target"), self.name)


# ----------------------------------------------------------------- the table
def _async(s: Spec) -> Built:
    return _async_member(s.name, s.fn), Crossing(Wait.CALL, s.fn, s.fn)


def _stream(s: Spec) -> Built:
    # Its generator is the stream's own: batched by default.
    ahead = s.ownership.read_ahead.get(s.name)
    return _stream_member(s.name, s.fn, ahead=ahead), Crossing(Wait.STREAM, s.fn, s.fn, ahead=ahead)


def _iteration(s: Spec) -> Built:
    # The object's own source: on demand by default.
    ahead = s.ownership.read_ahead.get("__aiter__", 0)
    rule = s.ownership.returns.get("__anext__")
    what = f"iterating a {s.cls.__qualname__} object"
    if rule is not None:  # returns={"__anext__": ...}: each item comes back as a proxy
        member, crossing = _owned_stream_member("__aiter__", _iterate, rule, what, ahead, s.own)
    else:
        member = _stream_member("__aiter__", _iterate, what, ahead)
        crossing = Crossing(Wait.STREAM, _iterate, _iterate, ahead=ahead)
    member.__qualname__ = f"{s.cls.__qualname__}.__aiter__"  # type: ignore[attr-defined]
    member.__doc__ = s.raw.__doc__
    return member, crossing


def _await(s: Spec) -> Built:
    raw = cast("Callable[[object], object]", s.raw)  # a sync __await__ (see _members)
    return await_member(s.cls, raw, s.ownership.returns.get("__await__"), s.own)


def _owned_call(s: Spec) -> Built:
    return _owned_call_member(s.name, s.fn, s.rule, s.own)


def _owned_stream(s: Spec) -> Built:
    what = f"{s.fn.__qualname__}()"
    ahead = s.ownership.read_ahead.get(s.name)
    return _owned_stream_member(s.name, s.fn, s.rule, what, ahead, s.own)


def _pending(s: Spec) -> Built:
    return _pending_member(s.name, s.fn, s.rule, s.own)


def _owned_attr(s: Spec) -> Built:
    return _OwnedAttr(s.name, s.rule, f"{s.cls.__qualname__}.{s.name}", s.own), None


def _passthrough(s: Spec) -> Built:
    return _Passthrough(s.name), None


def _refused(s: Spec) -> Built:
    return refused_member(s.cls.__qualname__, s.name, s.raw), None


def _class_level(s: Spec) -> Built:
    """A classmethod or staticmethod: inherited as is, unless it is async.

    An async one runs on the owner loop like an instance's async member (it
    may touch class-level state bound to that loop), and a classmethod gets the
    object's own class as ``cls``, never the proxy class.
    """
    raw, name = s.raw, s.name
    func = getattr(raw, "__func__", None)
    if not isinstance(raw, (classmethod, staticmethod)) or func is None:
        return None, None
    is_gen = inspect.isasyncgenfunction(func)
    if not (is_gen or inspect.iscoroutinefunction(func)):
        return None, None
    if isinstance(raw, classmethod):

        def on_owner(target: object, /, *args: object, **kwargs: object) -> object:
            return func(type(target), *args, **kwargs)

    else:

        def on_owner(target: object, /, *args: object, **kwargs: object) -> object:
            return func(*args, **kwargs)

    on_owner.__name__ = name
    on_owner.__qualname__ = func.__qualname__
    on_owner.__doc__ = func.__doc__
    if is_gen:
        return _stream_member(name, on_owner), Crossing(Wait.STREAM, on_owner, on_owner)
    return _async_member(name, on_owner, generic=True), Crossing(Wait.CALL, on_owner, on_owner)


#: Every member kind and the builder of its proxy member (and crossing).
FACES: dict[MemberKind, Callable[[Spec], Built]] = {
    MemberKind.ASYNC: _async,
    MemberKind.STREAM: _stream,
    MemberKind.ITERATION: _iteration,
    MemberKind.AWAIT: _await,
    MemberKind.OWNED_CALL: _owned_call,
    MemberKind.OWNED_STREAM: _owned_stream,
    MemberKind.PENDING: _pending,
    MemberKind.OWNED_ATTR: _owned_attr,
    MemberKind.STABLE: _passthrough,
    MemberKind.THREADSAFE: _passthrough,
    MemberKind.SYNC: _refused,
    MemberKind.CLASS_LEVEL: _class_level,
}
if set(FACES) != set(MemberKind):  # pragma: no cover - a row is missing
    raise AssertionError(f"no row in FACES for {set(MemberKind) - set(FACES)}")


# -------------------------------------------------------- generated classes
# What a generated class (a proxy's, an uncovered result's) knows of its members.
_crossings: dict[type, dict[str, Crossing]] = {}


def register(gcls: type, crossings: dict[str, Crossing]) -> None:
    """Record the crossings of the generated class ``gcls`` (before it is used)."""
    _crossings[gcls] = crossings


def forget(gcls: type) -> None:
    """Drop a generated class that lost the race to be cached."""
    _crossings.pop(gcls, None)


def crossings_of(gcls: type) -> dict[str, Crossing]:
    """The crossings of a generated class's marshalled members, by name.

    A subclass of a generated class (an adapter's layer over a proxy class, say,
    that wraps some async members for its own callers) has the crossings of the
    generated classes it derives from: what crosses is the member they marshal.
    """
    merged: dict[str, Crossing] = {}
    for klass in reversed(gcls.__mro__):
        merged.update(_crossings.get(klass, ()))
    return merged


def _no_del(self: object) -> None:
    pass  # the proxy owns nothing; the target's __del__ is the target's business


def _no_init(self: object, *args: object, **kwargs: object) -> None:
    raise TypeError("create proxies with loopbridge.proxy(obj)")


def _no_reduce(self: object) -> object:
    raise TypeError("a loopbridge proxy cannot be pickled: proxy the object in the other process")


def _no_reduce_ex(self: object, protocol: object) -> object:
    return _no_reduce(self)


#: Special methods every generated class defines itself: it is never constructed,
#: finalised or pickled as the class it stands for.
SEALED: dict[str, Callable[..., object]] = {
    "__del__": _no_del,
    "__init__": _no_init,
    "__reduce__": _no_reduce,
    "__reduce_ex__": _no_reduce_ex,
}
