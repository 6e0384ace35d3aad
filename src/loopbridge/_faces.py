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
  the class can be used, and never change afterwards;
* a member is what ``inspect`` and ``asyncio`` say the object's member is (a
  coroutine function, an async generator function, a classmethod bound to the
  object's own class), and on the owner loop it gives the method's own coroutine
  or generator (see :class:`FunctionLikeMember`);
* a generated class's instance that holds the last reference to its object
  frees it on the owner loop (see ``_no_del``).
"""

from __future__ import annotations

import enum
import functools
import inspect
import sys
import threading
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from ._affinity import original
from ._calls import route_call, route_exit
from ._codegen import build
from ._compat import MARKS_COROUTINE_FUNCTIONS, mark_coroutine_function
from ._members import MemberKind, class_data, refused_member
from ._operation import Options
from ._ownership import ON_OWNER, ON_OWNER_LOOP, ON_OWNER_THREAD, Ownership, on_owner_thread
from ._pending import Own, Pending
from ._ports import PORT_ATTR, get_running_loop
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
    name: str,
    fn: Callable[..., object],
    generic: bool = False,
    like: Callable[..., object] | None = None,
) -> Callable[..., object]:
    """``like``: the coroutine function it stands for (None: ``fn``)."""
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
    return _marked(_describe(member, name, fn), like or fn)


# What ``inspect.iscoroutinefunction`` (FastAPI, Starlette, ``mock.create_autospec``,
# pytest-asyncio, Ray) says of a proxy's async member must be what it says of the
# object's.  From 3.12 a plain function is marked as one at no cost per call.  Before
# 3.12 inspect reads only a code object's CO_COROUTINE flag, so there the member is
# a function-like object standing for the method (see FunctionLikeMember): an
# ``async def`` wrapper would give a coroutine of its own even on the owner loop,
# where a member gives the method's own coroutine.
def _marked(member: Callable[..., object], like: Callable[..., object]) -> Callable[..., object]:
    """``member``, a coroutine function to ``inspect`` and ``asyncio`` as ``like`` is."""
    if MARKS_COROUTINE_FUNCTIONS:
        return mark_coroutine_function(member)
    return _stands_for(member, like) if inspect.iscoroutinefunction(like) else member


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
    name: str,
    fn: Callable[..., object],
    what: str | None = None,
    ahead: int | None = None,
    like: Callable[..., object] | None = None,
) -> Callable[..., object]:
    """``ahead``: how far the stream reads ahead of its consumer (None: batched);
    ``like``: the async generator function it stands for (None: ``fn``)."""
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
    return _as_async_generator_function(_describe(member, name, fn), like or fn)


class FunctionLikeMember:
    """A proxy member as ``inspect`` sees the method it stands for.

    ``inspect.isasyncgenfunction`` reads the CO_ASYNC_GENERATOR flag of a code
    object, and before 3.12 ``inspect.iscoroutinefunction`` reads CO_COROUTINE;
    nothing marks a plain function with either.  A member cannot be a real
    ``async def`` (``... yield``) without changing what it gives: a wrapper
    generator would add a step per item and hide the stream from
    ``loopbridge.read_ahead``, and on the owner loop the member gives the
    method's own coroutine or generator, not one of a wrapper.  What it gives is
    what the method gives on the owner loop, and elsewhere an awaitable, or a
    stream with ``asend``, ``athrow`` and ``aclose`` (a
    ``collections.abc.AsyncGenerator``).

    So such a member is a function-like object, as a compiled (Cython) function
    is: ``__code__``, ``__defaults__`` and ``__kwdefaults__`` are those of the
    method it stands for, which is what ``inspect`` reads, and ``__wrapped__`` is
    that method, which is what ``inspect.signature`` follows.  Each member has a
    subclass of its own whose ``__call__`` is the generated member itself, so a
    call costs a binding (``__get__``) more than a function's.
    """

    def __get__(self, obj: object, objtype: type | None = None) -> object:
        return self if obj is None else types.MethodType(cast("Callable[..., Any]", self), obj)


def _as_async_generator_function(
    member: Callable[..., object], like: Callable[..., object]
) -> Callable[..., object]:
    """``member``, an async generator function to ``inspect`` as ``like`` is."""
    return _stands_for(member, like) if inspect.isasyncgenfunction(like) else member


def _stands_for(
    member: Callable[..., object], like: Callable[..., object]
) -> Callable[..., object]:
    """``member`` as a :class:`FunctionLikeMember` standing for ``like`` (``member``
    itself where ``like`` has no code object to stand for)."""
    code = getattr(like, "__code__", None)
    if not isinstance(code, types.CodeType):
        return member
    kind = type("FunctionLikeMember", (FunctionLikeMember,), {"__call__": staticmethod(member)})
    kind.__qualname__ = f"{member.__qualname__} (proxy member)"
    made: Callable[..., object] = kind()
    made.__dict__.update(
        __name__=member.__name__,
        __qualname__=member.__qualname__,
        __module__=getattr(like, "__module__", None),
        __doc__=member.__doc__,
        __annotations__=member.__annotations__,
        __wrapped__=getattr(member, "__wrapped__", like),
        __code__=code,
        __defaults__=getattr(like, "__defaults__", None),
        __kwdefaults__=getattr(like, "__kwdefaults__", None),
    )
    return made


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


_OWNED_CALL_MEMBER = """
def make({make_params}):
    def member({params}):
        __lb_target, __lb_opts = __lb_parts({self})
        if __lb_here(__lb_opts.ownership):
            return __lb_fn(__lb_target, __lb_opts, {args})
        return __lb_route(
            __lb_opts,
            __lb_grl(),
            __lb_fn,
            (__lb_target, __lb_opts, {positional}),
            {keywords},
            __lb_what,
        )
    return member
"""


def _owned_call_member(
    name: str, fn: Callable[..., Awaitable[object]], rule: Owned, own: Own
) -> Built:
    what = f"{fn.__qualname__}()"

    async def on_owner(target: object, opts: Options, /, *args: object, **kwargs: object) -> object:
        return own(await fn(target, *args, **kwargs), rule, what, opts)

    member = build(
        _OWNED_CALL_MEMBER,
        fn,
        "proxy member",
        generic=True,
        __lb_fn=on_owner,
        __lb_parts=_generic_parts,
        __lb_here=on_owner_thread,
        __lb_grl=get_running_loop,
        __lb_route=route_call,
        __lb_what=what,
    )
    made = _marked(_describe(member, name, fn), fn)
    return made, Crossing(Wait.CALL, fn, on_owner, with_opts=True)


def _owned_stream_member(
    name: str,
    fn: Callable[..., AsyncIterator[object]],
    rule: Owned | None,
    what: str,
    ahead: int | None,
    own: Own,
    like: Callable[..., object] | None = None,
) -> Built:
    """``like``: the async generator function the member stands for (None: ``fn``)."""

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

    made = _as_async_generator_function(_describe(member, name, fn), like or fn)
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
        member, crossing = _owned_stream_member(
            "__aiter__", _iterate, rule, what, ahead, s.own, like=s.fn
        )
    else:
        member = _stream_member("__aiter__", _iterate, what, ahead, like=s.fn)
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
    """A classmethod or staticmethod: what it is on the class; class-level data:
    the class's value unless the instance holds its own (``_members.ClassData``).

    A sync classmethod is bound to the object's own class, never the proxy class
    (whose instances only loopbridge makes): ``p.from_config(...)`` is
    ``type(obj).from_config(...)``.  A sync staticmethod is inherited as is.  An
    async one runs on the owner loop like an instance's async member (it may touch
    class-level state bound to that loop), a classmethod again with the object's
    own class as ``cls``.
    """
    raw, name = s.raw, s.name
    func = getattr(raw, "__func__", None)
    if not isinstance(raw, (classmethod, staticmethod)):
        return class_data(s.cls, name, raw), None  # data an instance may shadow
    if not callable(func):
        return None, None
    is_gen = inspect.isasyncgenfunction(func)
    if not (is_gen or inspect.iscoroutinefunction(func)):
        if isinstance(raw, classmethod):  # bound to the class, through an instance too
            return staticmethod(types.MethodType(func, s.cls)), None
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
    _sign_as_member(on_owner, func, isinstance(raw, classmethod))
    if is_gen:
        member = _stream_member(name, on_owner, like=func)
        return member, Crossing(Wait.STREAM, on_owner, on_owner)
    member = _async_member(name, on_owner, generic=True, like=func)
    return member, Crossing(Wait.CALL, on_owner, on_owner)


def _sign_as_member(
    on_owner: Callable[..., object], func: Callable[..., object], cls: bool
) -> None:
    """Give ``on_owner(target, ...)`` the signature of ``func`` as a member (less
    ``cls``), so a proxy member built from it has the signature it has on the object."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin or a callable with no signature
        return
    params = list(sig.parameters.values())[1 if cls else 0 :]
    target = inspect.Parameter("__lb_target", inspect.Parameter.POSITIONAL_ONLY)
    on_owner.__signature__ = sig.replace(parameters=[target, *params])  # type: ignore[attr-defined]


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


# ------------------------------------------------------- where the object dies
# A proxy that holds the last reference to its object, dropped on a thread other
# than the owner loop's, hands that reference to the owner loop (one post to its
# port, batched with the rest): the object is freed there, so its ``__del__``, and
# that of whatever only it held, runs on the loop that owns its state, as it
# would had the object been dropped there.  Anywhere else the reference is
# dropped where the proxy is (on the owner loop's thread; and where the owner
# loop is gone or loopbridge never talked to it, as there is no loop to run it).
# A proxy that is not the last holder changes nothing.  What the garbage collector
# frees in a reference cycle is freed wherever it runs.
def _target_alone(holder: object) -> bool:
    """Whether ``holder``'s ``_lb_target`` slot holds the only reference to it."""
    target = object.__getattribute__(holder, "_lb_target")
    return sys.getrefcount(target) <= _ALONE


class _Calibrate:
    __slots__ = ("_lb_target",)

    def __init__(self) -> None:
        self._lb_target = object()


def _references_alone() -> int:
    """What ``sys.getrefcount`` says in :func:`_target_alone` of a target only its
    holder references (measured: it varies with the interpreter's version)."""
    holder = _Calibrate()
    target = object.__getattribute__(holder, "_lb_target")
    return sys.getrefcount(target)  # the slot, ``target`` and the argument, as there


_ALONE = 0
_ALONE = _references_alone()


def _drop(box: list[object]) -> None:
    """Run on the owner loop: the object's last reference, in ``box``, goes here."""
    box.clear()


def _no_del(self: object, _exiting: Callable[[], bool] = sys.is_finalizing) -> None:
    """A proxy's finaliser: never its class's ``__del__``; hand the object over (above)."""
    if _exiting():
        # Interpreter exit: this module's globals may already be None (3.13t frees
        # the last proxies after clearing them), and no loop will run the object.
        return
    try:
        # The members its blocking faces bound (see _proxy.blocking_members) hold
        # the object too, and go with the proxy: drop them first.
        bound = object.__getattribute__(self, "_lb_blocking")
    except AttributeError:  # an uncovered result's class has no such slot
        bound = None
    if bound:
        bound.clear()
    try:
        if not _target_alone(self):
            return
        opts: Options = object.__getattribute__(self, "_lb_opts")
    except AttributeError:  # made, but never filled in
        return
    ownership = opts.ownership
    if on_owner_thread(ownership):
        return
    port = ownership._port or getattr(ownership.loop, PORT_ATTR, None)
    if port is not None and port.dead is None:
        # The reference moves into the box before it is posted: the owner may run
        # _drop at once, and then must hold the last one, not share it with the slot.
        box = [object.__getattribute__(self, "_lb_target")]
        object.__delattr__(self, "_lb_target")
        port.post(_drop, box)


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
