"""The two faces of a loop-affine object: ``proxy`` (awaitable) and ``blocking``.

``proxy(obj)`` returns an instance of a generated subclass of ``type(obj)`` whose
every member is replaced by a marshalling or refusing one, so
``isinstance(p, type(obj))`` holds and abstract base classes (vLLM's
``EngineClient``) accept it.  The proxy never runs the base class's ``__init__``
or ``__del__``.  Member kinds come from :func:`~loopbridge._members.classify`;
generated classes are cached per (class, declarations).
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar, cast

from ._affinity import _Policy, original
from ._calls import Call, call_from_thread, route_call, route_exit
from ._codegen import Maker, build, make_class
from ._construction import NoPublicConstructor
from ._errors import LoopAffinityError
from ._members import MemberKind, classify, is_special, refusal, refused_member
from ._metrics import Metrics
from ._operation import Options
from ._ownership import (
    ON_OWNER,
    ON_OWNER_LOOP,
    ON_OWNER_THREAD,
    Ownership,
    attach,
    on_owner_thread,
    ownership_of,
)
from ._pending import Pending
from ._ports import get_running_loop
from ._returns import PLAIN, Owned, loop_state
from ._streams import BlockingStream, Channel, RemoteStream

__all__ = [
    "proxy",
    "blocking",
    "Blocking",
    "read_ahead",
    "is_proxy",
    "unwrap",
    "metrics_of",
    "DEFAULT_WINDOW",
    "DEFAULT_GRACE",
]

T = TypeVar("T")

DEFAULT_WINDOW = 256
DEFAULT_GRACE = 5.0

# The owner (for the same-loop test, read on every call) and the settings
# every call and stream made through this proxy share.
_SLOTS = ("_lb_target", "_lb_ownership", "_lb_opts")


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


def _async_member(name: str, fn: Callable[..., Any], generic: bool = False) -> Callable[..., Any]:
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
    return _describe(member, name, fn, MemberKind.ASYNC)


def _describe(
    member: Callable[..., Any], name: str, fn: Callable[..., Any], kind: MemberKind
) -> Callable[..., Any]:
    member.__name__ = name
    member.__qualname__ = fn.__qualname__
    member.__doc__ = fn.__doc__
    member.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    member.__wrapped__ = fn  # type: ignore[attr-defined]
    member.__loopbridge_kind__ = kind  # type: ignore[attr-defined]
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
    name: str, fn: Callable[..., Any], what: str | None = None, ahead: int | None = None
) -> Callable[..., Any]:
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
    member.__loopbridge_ahead__ = ahead  # type: ignore[attr-defined]
    return _describe(member, name, fn, MemberKind.STREAM)


def channel_maker(ahead: int | None) -> Callable[..., Channel]:
    """How a stream member makes its channel: batched (the plain class), or on demand."""
    return Channel if ahead is None else functools.partial(Channel, ahead=ahead)


async def _iterate(self: Any) -> AsyncIterator[Any]:
    """The object's own async iteration (its ``__aiter__`` and ``__anext__``), as
    an async generator that a proxy streams: it runs on the owner loop."""
    async for item in self:
        yield item


def _iteration_member(
    cls: type, raw: Any, rule: Owned | None, ahead: int | None
) -> Callable[..., Any]:
    what = f"iterating a {cls.__qualname__} object"
    if rule is not None:  # returns={"__anext__": ...}: each item comes back as a proxy
        member = _owned_stream_member("__aiter__", _iterate, rule, what, ahead)
    else:
        member = _stream_member("__aiter__", _iterate, what, ahead)
    member.__qualname__ = f"{cls.__qualname__}.__aiter__"
    member.__doc__ = raw.__doc__
    return member


# ------------------------------------------------- returned loop-bound objects
# Members with a returns rule (see _returns): what they give back is made a
# proxy on the owner loop, by _own, before it crosses.  Plain forwarding is
# enough here: each of these calls crosses threads, which costs far more.
def _generic_parts(self: Any) -> tuple[Any, Options]:
    get = object.__getattribute__
    return get(self, "_lb_target"), get(self, "_lb_opts")


def _owned_call_member(name: str, fn: Callable[..., Any], rule: Owned) -> Callable[..., Any]:
    what = f"{fn.__qualname__}()"

    async def on_owner(target: Any, opts: Options, /, *args: Any, **kwargs: Any) -> Any:
        return _own(await fn(target, *args, **kwargs), rule, what, opts)

    def member(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        target, opts = _generic_parts(self)
        if on_owner_thread(opts.ownership):
            return on_owner(target, opts, *args, **kwargs)
        return route_call(opts, get_running_loop(), on_owner, (target, opts, *args), kwargs, what)

    member.__loopbridge_on_owner__ = on_owner  # type: ignore[attr-defined]
    return _describe(member, name, fn, MemberKind.OWNED_CALL)


def _owned_stream_member(
    name: str, fn: Callable[..., Any], rule: Owned | None, what: str, ahead: int | None
) -> Callable[..., Any]:
    async def on_owner(target: Any, opts: Options, /, *args: Any, **kwargs: Any) -> Any:
        agen = fn(target, *args, **kwargs)
        try:
            async for item in agen:
                yield _own(item, rule, what, opts)
        finally:
            await agen.aclose()  # closed early: close the member's generator here

    def member(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        target, opts = _generic_parts(self)
        if on_owner_thread(opts.ownership):
            return on_owner(target, opts, *args, **kwargs)
        ch = Channel(on_owner, (target, opts, *args), kwargs, what, opts, ahead=ahead)
        return RemoteStream(ch)

    member.__loopbridge_on_owner__ = on_owner  # type: ignore[attr-defined]
    member.__loopbridge_ahead__ = ahead  # type: ignore[attr-defined]
    return _describe(member, name, fn, MemberKind.OWNED_STREAM)


def _pending_member(name: str, fn: Callable[..., Any], rule: Owned) -> Callable[..., Any]:
    what = f"{fn.__qualname__}()"

    def member(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        target, opts = _generic_parts(self)
        # Made on the owner loop when first awaited, entered or iterated.
        return Pending(fn, (target, *args), kwargs, rule, opts, what, _own)

    return _describe(member, name, fn, MemberKind.PENDING)


def _await_member(cls: type, raw: Any, rule: Owned | None) -> Callable[..., Any]:
    what = f"awaiting a {cls.__qualname__} object"

    async def on_owner(target: Any, opts: Options) -> Any:
        value = await target
        return value if rule is None else _own(value, rule, what, opts)

    def __await__(self: Any) -> Any:
        target, opts = _generic_parts(self)
        if on_owner_thread(opts.ownership):
            return raw(target)
        return route_call(opts, get_running_loop(), on_owner, (target, opts), {}, what).__await__()

    member = _describe(__await__, "__await__", raw, MemberKind.AWAIT)
    member.__qualname__ = f"{cls.__qualname__}.__await__"
    member.__loopbridge_on_owner__ = on_owner  # type: ignore[attr-defined]
    return member


def class_level_member(name: str, raw: Any) -> Callable[..., Any] | None:
    """A classmethod or staticmethod: inherited as is, unless it is async.

    An async one runs on the owner loop like an instance's async member (it
    may touch class-level state bound to that loop), and a classmethod gets the
    object's own class as ``cls``, never the proxy class.
    """
    func = getattr(raw, "__func__", None)
    if not isinstance(raw, (classmethod, staticmethod)) or func is None:
        return None
    is_gen = inspect.isasyncgenfunction(func)
    if not (is_gen or inspect.iscoroutinefunction(func)):
        return None
    if isinstance(raw, classmethod):

        def on_owner(target: Any, /, *args: Any, **kwargs: Any) -> Any:
            return func(type(target), *args, **kwargs)

    else:

        def on_owner(target: Any, /, *args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

    on_owner.__name__ = name
    on_owner.__qualname__ = func.__qualname__
    on_owner.__doc__ = func.__doc__
    if is_gen:
        return _stream_member(name, on_owner)
    return _async_member(name, on_owner, generic=True)


class _OwnedAttr:
    """A data member with a returns rule: read directly, its value comes back as a proxy."""

    __slots__ = ("name", "rule", "what")

    def __init__(self, name: str, rule: Owned, what: str) -> None:
        self.name = name
        self.rule = rule
        self.what = what

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        target, opts = _generic_parts(obj)
        return _own(getattr(target, self.name), self.rule, self.what, opts)


def _own(value: Any, rule: Owned | None, what: str, opts: Options) -> Any:
    """What the caller gets for ``value``, which ``what`` gave back on the owner loop.

    With a rule: a proxy of ``value`` owned by the same loop, with the rule's
    declarations.  Without one: :func:`_checked`.
    """
    if rule is None:
        return _checked(value, what, opts)
    if type(value) in PLAIN or _is_proxy(value):
        return value
    ownership = ownership_of(value)
    if ownership is None:
        ownership = Ownership(
            opts.ownership.owner.loop,
            rule.stable,
            rule.threadsafe,
            f"{type(value).__qualname__} object from {what}",
            rule.returns,
        )
        attach(value, ownership)
    return _new_proxy(value, ownership, opts.window, opts.grace, opts.eager)


def _shape(call: Call, result: Any) -> Any:
    """Every proxy's ``Options.shape``: a call's non-plain result, on the owner loop."""
    args = call.args
    if args and result is args[0]:
        # The object itself (``async with p as x`` when __aenter__ returns self,
        # fluent APIs): the caller gets a proxy, never the bare object.
        opts = call.opts
        return _new_proxy(result, opts.ownership, opts.window, opts.grace, opts.eager)
    return _checked(result, call.description, call.opts)


def _checked(value: Any, what: str, opts: Options) -> Any:
    """A result no rule covers: loop-affine ones come back as proxies; others
    that hold loop-bound state are caught by the always-on check."""
    if type(value) in PLAIN or _is_proxy(value):
        return value
    ownership = ownership_of(value)
    if ownership is not None:  # declared loop-affine: its own declarations say how
        return _new_proxy(value, ownership, opts.window, opts.grace, opts.eager)
    found = loop_state(value)
    if found is None or _Policy.mode == "off":
        return value
    member = what.rsplit(".", 1)[-1].removesuffix("()")
    awaitable = hasattr(type(value), "__await__")
    msg = (
        f"{what} returned a {type(value).__qualname__} object that holds loop-bound state "
        f"({found}), and no returns rule covers it, so it cannot be used off its owner loop"
        f"{' (awaiting it can: it is awaited there)' if awaitable else ''}. "
        f"Declare returns={{{member!r}: loopbridge.Owned(...)}} (in adopt(...) or "
        "@loop_affine(...)) to get it back as a proxy, or use it on its owner loop "
        "(loopbridge.unwrap gives the object)."
    )
    if _Policy.mode == "warn":
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return value
    return _tripwire(value, msg, opts)


def _tripwire(value: Any, msg: str, opts: Options) -> Any:
    cls = type(value)
    made = _tripwire_classes.get(cls)
    if made is None:
        made = _tripwire_classes.setdefault(cls, _tripwire_class(cls))
    tcls, maker = made
    t: Any = maker(tcls)
    object.__setattr__(t, "_lb_target", value)
    object.__setattr__(t, "_lb_refusal", msg)
    object.__setattr__(t, "_lb_opts", opts)  # awaiting it: on the owner (see _tripwire_class)
    return t


class _Tripped:
    """Every member of an uncovered loop-bound result: using it raises the check's error."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        raise _tripped(obj, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        raise _tripped(obj, self.name)


def _tripped(obj: Any, name: str) -> LoopAffinityError:
    return LoopAffinityError(f"{object.__getattribute__(obj, '_lb_refusal')} (used: .{name})")


def _tripped_special(name: str) -> Callable[..., Any]:
    """A special method of an uncovered result: Python calls it for an operator (``await``,
    ``==``, ``len``), so it must be a method that raises, not an attribute: the
    operator slots swallow an error raised while the method is looked up."""

    def tripped(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise _tripped(self, name)

    tripped.__name__ = name
    return tripped


def _tripped_getattr(self: Any, name: str) -> Any:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise _tripped(self, name)


def _tripped_setattr(self: Any, name: str, value: Any = None) -> None:
    raise _tripped(self, name)


def _tripped_repr(self: Any) -> str:
    value = object.__getattribute__(self, "_lb_target")
    return f"<loopbridge: {type(value).__qualname__} object no returns rule covers>"


_tripwire_classes: dict[type, tuple[type, Maker]] = {}
_TRIPWIRE_SLOTS = ("_lb_target", "_lb_refusal", "_lb_opts")


def _tripwire_class(cls: type) -> tuple[type, Maker]:
    """Every member refuses, except awaiting an awaitable (a Future, a Task, a
    coroutine): that is marshalled, as awaiting it on its owner is always right,
    and what it gives is checked in turn."""
    empty = Ownership(None, frozenset(), frozenset(), cls.__qualname__)
    ns: dict[str, Any] = {"__slots__": _TRIPWIRE_SLOTS, "__loopbridge_proxy__": True}
    for name, (kind, raw) in classify(cls, empty).items():
        if kind is MemberKind.AWAIT:
            ns[name] = _await_member(cls, raw, None)
        else:
            ns[name] = _tripped_special(name) if is_special(name) else _Tripped(name)
    if hasattr(cls, "_asyncio_future_blocking"):
        ns["_asyncio_future_blocking"] = None  # no future of the caller's loop (see above)
    ns["__getattribute__"] = object.__getattribute__
    ns["__getattr__"] = _tripped_getattr
    ns["__setattr__"] = ns["__delattr__"] = _tripped_setattr
    ns["__repr__"] = _tripped_repr
    ns["__del__"] = _no_del
    ns["__init__"] = _no_init
    ns["__reduce__"] = _no_reduce
    ns["__reduce_ex__"] = _no_reduce_ex
    tcls, maker = make_class(cls, f"{cls.__name__}Uncovered", ns)
    tcls.__module__ = cls.__module__
    tcls.__qualname__ = f"{cls.__qualname__}Uncovered"
    return tcls, maker


def _is_proxy(obj: object) -> bool:
    return bool(getattr(type(obj), "__loopbridge_proxy__", False))


class _Passthrough:
    """A declared stable / thread-safe member: read from the target directly."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return getattr(object.__getattribute__(obj, "_lb_target"), self.name)


# --------------------------------------------------------------- proxy class
_cache: dict[tuple[type, Any], tuple[type, Maker]] = {}
_cache_lock = threading.Lock()


def _proxy_class(cls: type, ownership: Ownership) -> tuple[type, Maker]:
    """The proxy class for ``cls`` with these declarations, and how to make its instances."""
    key = (cls, ownership.spec_key())
    made = _cache.get(key)
    if made is not None:
        return made
    ns: dict[str, Any] = {"__slots__": _SLOTS, "__loopbridge_proxy__": True}
    for name, (kind, raw) in classify(cls, ownership).items():
        member = _proxy_member(cls, name, kind, raw, ownership)
        if member is not None:  # None: CLASS_LEVEL, inherited as is
            ns[name] = member
    if hasattr(cls, "_asyncio_future_blocking"):
        # A future's proxy is no future of the caller's loop: asyncio.isfuture()
        # must say so, and ensure_future() then awaits it through __await__.
        ns["_asyncio_future_blocking"] = None
    ns["__getattribute__"] = object.__getattribute__  # members are the class's, above
    ns["__getattr__"] = _instance_attr
    ns["__setattr__"] = _no_setattr
    ns["__delattr__"] = _no_setattr
    ns["__repr__"] = _repr
    ns["__del__"] = _no_del
    ns["__init__"] = _no_init
    ns["__reduce__"] = _no_reduce
    ns["__reduce_ex__"] = _no_reduce_ex
    pcls, maker = make_class(cls, f"{cls.__name__}Proxy", ns)
    pcls.__module__ = cls.__module__
    pcls.__qualname__ = f"{cls.__qualname__}Proxy"
    with _cache_lock:
        _cache.setdefault(key, (pcls, maker))
    return _cache[key]


def _proxy_member(cls: type, name: str, kind: MemberKind, raw: Any, ownership: Ownership) -> Any:
    """The proxy's member ``name`` of kind ``kind`` (``None``: inherited as is)."""
    rules = ownership.returns
    if kind is MemberKind.ASYNC:
        return _async_member(name, original(raw))
    if kind is MemberKind.STREAM:  # its generator is the stream's own: batched by default
        return _stream_member(name, original(raw), ahead=ownership.read_ahead.get(name))
    if kind is MemberKind.ITERATION:  # the object's own source: on demand by default
        ahead = ownership.read_ahead.get("__aiter__", 0)
        return _iteration_member(cls, raw, rules.get("__anext__"), ahead)
    if kind is MemberKind.AWAIT:
        return _await_member(cls, raw, rules.get("__await__"))
    if kind is MemberKind.OWNED_CALL:
        return _owned_call_member(name, original(raw), rules[name])
    if kind is MemberKind.OWNED_STREAM:
        fn = original(raw)
        what = f"{fn.__qualname__}()"
        return _owned_stream_member(name, fn, rules[name], what, ownership.read_ahead.get(name))
    if kind is MemberKind.PENDING:
        return _pending_member(name, original(raw), rules[name])
    if kind is MemberKind.OWNED_ATTR:
        return _OwnedAttr(name, rules[name], f"{cls.__qualname__}.{name}")
    if kind in (MemberKind.STABLE, MemberKind.THREADSAFE):
        return _Passthrough(name)
    if kind is MemberKind.SYNC:
        return refused_member(cls.__qualname__, name, raw)
    return class_level_member(name, raw)


def _instance_attr(self: Any, name: str) -> Any:
    """Instance attributes (set in ``__init__``) that no class member describes."""
    get = object.__getattribute__
    ownership: Ownership = get(self, "_lb_ownership")
    target = get(self, "_lb_target")
    if name in ownership.stable or name in ownership.threadsafe:
        return getattr(target, name)
    rule = ownership.returns.get(name)
    if rule is not None:  # an instance attribute holding an owned object (a grpc stub's)
        opts: Options = get(self, "_lb_opts")
        value = getattr(target, name)
        what = f"{type(target).__qualname__}.{name}"
        if inspect.ismethod(value) or inspect.isfunction(value):
            return _pending_factory(value, rule, opts, f"{what}()")
        return _own(value, rule, what, opts)
    if is_special(name):
        raise AttributeError(name)
    if not hasattr(target, name):
        raise AttributeError(f"{type(target).__qualname__!r} object has no attribute {name!r}")
    raise _dynamic_refusal(target, name)


def _pending_factory(
    fn: Callable[..., Any], rule: Owned, opts: Options, what: str
) -> Callable[..., Any]:
    """A method no class attribute describes (an instance's, or one ``__getattr__``
    makes) with a returns rule: like a sync member with one, calling it gives a
    pending result, and the method runs on the owner when that is first used."""

    def call(*args: Any, **kwargs: Any) -> Pending:
        return Pending(fn, args, kwargs, rule, opts, what, _own)

    call.__name__ = getattr(fn, "__name__", "call")
    call.__loopbridge_kind__ = MemberKind.PENDING  # type: ignore[attr-defined]
    return call


def _dynamic_refusal(target: Any, name: str) -> LoopAffinityError:
    """The refusal of a member no class attribute describes: an instance attribute, or
    one its class's ``__getattr__`` makes (often an async method: returns= is the fix)."""
    try:
        own = object.__getattribute__(target, "__dict__")
    except AttributeError:
        own = {}
    cls_name = type(target).__qualname__
    if name in own:
        return refusal(cls_name, name, own[name], " (an instance attribute)")
    return refusal(cls_name, name, None, f" (made by {cls_name}.__getattr__)")


def _no_setattr(self: Any, name: str, value: Any = None) -> None:
    raise LoopAffinityError(
        f"cannot set or delete {name!r} through a proxy: state of a loop-affine object "
        "changes only on its owner loop (call an async method that does it)"
    )


def _repr(self: Any) -> str:
    get = object.__getattribute__
    ownership: Ownership = get(self, "_lb_ownership")
    return f"<loopbridge proxy of {get(self, '_lb_target')!r} owned by {ownership.loop!r}>"


def _no_del(self: Any) -> None:
    pass  # the proxy owns nothing; the target's __del__ is the target's business


def _no_init(self: Any, *args: Any, **kwargs: Any) -> None:
    raise TypeError("create proxies with loopbridge.proxy(obj)")


def _no_reduce(self: Any) -> Any:
    raise TypeError("a loopbridge proxy cannot be pickled: proxy the object in the other process")


def _no_reduce_ex(self: Any, protocol: Any) -> Any:
    return _no_reduce(self)


def proxy(
    obj: T,
    *,
    stream_window: int = DEFAULT_WINDOW,
    cancel_grace: float = DEFAULT_GRACE,
    eager: bool = False,
) -> T:
    """A view of ``obj`` that is safe to use from any thread or event loop.

    * Async methods run on the owner loop; awaiting them from another asyncio loop
      (uvloop included) or from trio (e.g. through anyio) returns their result or
      raises their exception.  On the owner loop itself they are called directly.
    * Async generator methods run on the owner loop; their items stream to the
      consumer with back-pressure (at most ``stream_window`` items ahead).
    * Members declared ``stable`` or ``threadsafe`` are used directly.
    * Any other sync member raises :class:`LoopAffinityError`.

    If the caller is cancelled, the owner-side work is cancelled with the same
    message and the caller waits up to ``cancel_grace`` seconds for its cleanup.

    Owner-side tasks start eagerly on Python 3.12+ (``eager_start``): a call
    that finishes without suspending answers in the same loop iteration.  On
    3.11, ``eager=True`` gets the same effect by running the first step before
    any task exists; ``asyncio.current_task()`` is then ``None`` during that
    step, so only use it for members that need no task before their first
    ``await`` (no ``asyncio.timeout()``, ``TaskGroup`` or anyio scope there).
    """
    if getattr(type(obj), "__loopbridge_proxy__", False):
        return obj
    ownership = ownership_of(obj)
    if ownership is None:
        raise LoopAffinityError(
            f"{type(obj).__qualname__} object is not loop-affine: decorate its class with "
            "@loop_affine, or declare the instance with loopbridge.adopt(obj, loop=...)"
        )
    if stream_window < 1:
        raise ValueError(f"stream_window must be at least 1, not {stream_window}")
    if cancel_grace < 0:
        raise ValueError(f"cancel_grace must not be negative, not {cancel_grace}")
    return cast(T, _new_proxy(obj, ownership, stream_window, cancel_grace, bool(eager)))


def _new_proxy(obj: Any, ownership: Ownership, window: int, grace: float, eager: bool) -> Any:
    pcls, maker = _proxy_class(type(obj), ownership)
    p: Any = maker(pcls)  # an empty instance of a subclass of type(obj)
    setattr_ = object.__setattr__
    setattr_(p, "_lb_target", obj)
    setattr_(p, "_lb_ownership", ownership)
    setattr_(p, "_lb_opts", Options(ownership, window, grace, eager, _shape))
    return p


S = TypeVar("S")


def read_ahead(stream: S, items: int | None) -> S:
    """Set how far ``stream`` may read ahead of its consumer; returns ``stream``.

    ``stream``: what an async generator member, an async-iterable object or a
    pending result gives through a proxy (or its blocking face), before its
    first item is asked for.  ``items=0``: the owner asks the source for an item
    only once the consumer has asked for it, so leaving early leaves the rest
    in the source; ``n``: up to ``n`` more; ``None``: batched, up to the proxy's
    ``stream_window`` (the default for a generator member, whose generator is
    the stream's own).  Items read ahead that the consumer never takes are
    lost to the source and counted (``stream_items_unread``).  On the owner
    loop a member gives the generator itself, which reads nothing ahead: it
    is returned unchanged.
    """
    if items is not None and (type(items) is not int or items < 0):
        raise ValueError(f"read_ahead takes 0 or more items, or None, not {items!r}")
    if type(stream) is Pending:
        cast(Pending, stream).ahead = items
        return stream
    if isinstance(stream, (RemoteStream, BlockingStream)):
        if object.__getattribute__(stream, "_waker") is not None:
            raise ValueError("read_ahead() applies before the stream's first item is asked for")
        object.__getattribute__(stream, "_ch").set_ahead(items)
        return stream
    if inspect.isasyncgen(stream) or hasattr(type(stream), "__anext__"):
        return stream  # the generator itself, on its owner loop: no pump, nothing ahead
    raise TypeError(
        "read_ahead() takes what an async generator member, an async-iterable object or a "
        f"pending result gave through a proxy, not a {type(stream).__qualname__} object"
    )


def is_proxy(obj: object) -> bool:
    """Whether ``obj`` is a loopbridge proxy."""
    return bool(getattr(type(obj), "__loopbridge_proxy__", False))


def unwrap(obj: T) -> T:
    """The object behind a proxy (``obj`` itself if it is not one).

    The result is only safe to use on its owner loop.
    """
    if getattr(type(obj), "__loopbridge_proxy__", False):
        return object.__getattribute__(obj, "_lb_target")  # type: ignore[no-any-return]
    return obj


def metrics_of(p: object) -> Metrics:
    """The metrics of the object behind a proxy (shared by all its proxies)."""
    if not getattr(type(p), "__loopbridge_proxy__", False):
        raise TypeError(f"expected a loopbridge proxy, got {type(p).__qualname__}")
    opts: Options = object.__getattribute__(p, "_lb_opts")
    return opts.metrics


# ------------------------------------------------------------- blocking face
class Blocking(Generic[T], metaclass=NoPublicConstructor):
    """The face of a loop-affine object for plain threads.

    Async methods become blocking calls; async generator methods become blocking
    iterators (use them in a ``with`` block, or exhaust them, to close promptly).
    Declared stable and thread-safe members are used directly.  Only the calling
    thread blocks; using it on the owner loop's thread raises instead of
    deadlocking.

    An object that is an async context manager is a context manager here, one
    that is async-iterable is iterable, and an async ``__call__`` is a call.  The
    face of a pending result (a sync member with a ``returns`` rule) also has
    ``result()``, which waits for what awaiting it gives.
    """

    __slots__ = ("_lb_proxy", "_lb_members", "_lb_timeout")
    _lb_factory = "loopbridge.blocking()"

    def __init__(self, p: T, timeout: float | None = None) -> None:
        object.__setattr__(self, "_lb_proxy", p)
        object.__setattr__(self, "_lb_members", {})
        object.__setattr__(self, "_lb_timeout", timeout)

    def __getattr__(self, name: str) -> Any:
        get = object.__getattribute__
        p = get(self, "_lb_proxy")
        timeout: float | None = get(self, "_lb_timeout")
        if type(p) is Pending:
            if name == "result":
                return lambda: p.result_blocking(timeout)
            raise AttributeError(f"a pending result's blocking face has no {name!r}")
        members: dict[str, Any] = get(self, "_lb_members")
        member = members.get(name)
        if member is not None:
            return member
        unbound = _blocking_member(type(p), name)
        if unbound is None:
            return _face_of_value(p, name, timeout)
        member = members[name] = types.MethodType(
            unbound, _Bound(get(p, "_lb_target"), get(p, "_lb_opts"), timeout)
        )
        return member

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__getattr__("__call__")(*args, **kwargs)

    def __enter__(self) -> Any:
        p = object.__getattribute__(self, "_lb_proxy")
        if type(p) is Pending:
            return p.enter_blocking(object.__getattribute__(self, "_lb_timeout"))
        return self.__getattr__("__aenter__")()

    def __exit__(self, et: Any, exc: Any, tb: Any) -> Any:
        p = object.__getattribute__(self, "_lb_proxy")
        if type(p) is Pending:
            return p.exit_blocking(et, exc, tb, object.__getattribute__(self, "_lb_timeout"))
        return self.__getattr__("__aexit__")(et, exc, tb)

    def __iter__(self) -> Any:
        p = object.__getattribute__(self, "_lb_proxy")
        if type(p) is Pending:
            return p.iter_blocking(object.__getattribute__(self, "_lb_timeout"))
        return self.__getattr__("__aiter__")()

    def __setattr__(self, name: str, value: Any) -> None:
        _no_setattr(self, name)

    def __repr__(self) -> str:
        return f"<loopbridge blocking face of {object.__getattribute__(self, '_lb_proxy')!r}>"


def _face_of_value(p: Any, name: str, timeout: float | None) -> Any:
    """A member that is not marshalled: passed through (or the proxy's own refusal);
    an owned data member and a pending factory give blocking faces too."""
    value = getattr(p, name)
    if name in object.__getattribute__(p, "_lb_ownership").returns:
        if _is_proxy(value):
            return Blocking._create(value, timeout)  # an owned data member: its face too
        if getattr(value, "__loopbridge_kind__", None) is MemberKind.PENDING:
            return lambda *a, **k: Blocking._create(value(*a, **k), timeout)
    return value


class _Bound:
    """What a blocking member is bound to: the target, its proxy's settings and the
    face's timeout."""

    __slots__ = ("target", "opts", "timeout")

    def __init__(self, target: Any, opts: Options, timeout: float | None) -> None:
        self.target = target
        self.opts = opts
        self.timeout = timeout


# The blocking face's members, rendered from the proxy member's original with
# the same signature machinery; ``{self}`` is a _Bound.
_BLOCKING_CALL = """
def make({make_params}):
    def member({params}):
        return __lb_run(
            __lb_call(__lb_fn, ({self}.target, {positional}), {keywords}, __lb_what, {self}.opts),
            {self}.timeout,
        )
    return member
"""
_BLOCKING_STREAM = """
def make({make_params}):
    def member({params}):
        return __lb_stream(
            __lb_channel(__lb_fn, ({self}.target, {positional}), {keywords}, __lb_what, {self}.opts),
            {self}.timeout,
        )
    return member
"""
_blocking_members: dict[tuple[type, str], Callable[..., Any] | None] = {}


def _blocking_member(pcls: type, name: str) -> Callable[..., Any] | None:
    """The unbound blocking member ``name`` of proxy class ``pcls`` (None: not marshalled)."""
    key = (pcls, name)
    try:
        return _blocking_members[key]
    except KeyError:
        pass
    raw = getattr(pcls, name, None)
    fn = getattr(raw, "__wrapped__", None)
    kind = getattr(raw, "__loopbridge_kind__", None)
    member: Callable[..., Any] | None = None
    if fn is not None and kind is MemberKind.ASYNC:
        member = build(
            _BLOCKING_CALL,
            fn,
            "blocking member",
            __lb_fn=fn,
            __lb_run=call_from_thread,
            __lb_call=Call,
            __lb_what=f"{fn.__qualname__}()",
        )
    elif fn is not None and kind is MemberKind.STREAM:
        member = build(
            _BLOCKING_STREAM,
            fn,
            "blocking stream member",
            __lb_fn=fn,
            __lb_stream=BlockingStream._create,
            __lb_channel=channel_maker(getattr(raw, "__loopbridge_ahead__", None)),
            __lb_what=f"{fn.__qualname__}()",
        )
    if member is None and fn is not None:
        member = _blocking_owned_member(name, raw, fn, kind)
    if member is None and name == "result":
        member = _blocking_result(pcls)  # named by itself
    elif member is not None:
        member.__name__ = name
        member.__qualname__ = fn.__qualname__  # type: ignore[union-attr]
        member.__doc__ = fn.__doc__
        annotations = dict(getattr(fn, "__annotations__", {}))
        if kind is MemberKind.STREAM:  # a BlockingStream, not the async iterator
            annotations.pop("return", None)
        member.__annotations__ = annotations
    _blocking_members.setdefault(key, member)
    return _blocking_members[key]


def _blocking_result(pcls: type) -> Callable[..., Any] | None:
    """``blocking(p).result()`` of an awaitable proxy (a future's, say): waits for what
    awaiting it gives.  None where awaiting the object is not marshalled."""
    await_ = getattr(pcls, "__await__", None)
    if getattr(await_, "__loopbridge_kind__", None) is not MemberKind.AWAIT:
        return None
    on_owner = await_.__loopbridge_on_owner__  # type: ignore[union-attr]
    what = f"awaiting a {pcls.__qualname__.removesuffix('Proxy')} object"

    def result(bound: _Bound, /) -> Any:
        c = Call(on_owner, (bound.target, bound.opts), {}, what, bound.opts)
        return call_from_thread(c, bound.timeout)

    result.__qualname__ = f"{pcls.__qualname__}.result"
    result.__doc__ = "Block until awaiting the object on its owner loop gives its result."
    return result


def _blocking_owned_member(
    name: str, raw: Any, fn: Callable[..., Any], kind: MemberKind | None
) -> Callable[..., Any] | None:
    """Blocking members for members with a returns rule (plain forwarding)."""
    what = f"{fn.__qualname__}()"
    if kind is MemberKind.OWNED_CALL:
        on_owner = raw.__loopbridge_on_owner__

        def call(bound: _Bound, /, *args: Any, **kwargs: Any) -> Any:
            c = Call(on_owner, (bound.target, bound.opts, *args), kwargs, what, bound.opts)
            return call_from_thread(c, bound.timeout)

        return call
    if kind is MemberKind.OWNED_STREAM:
        on_owner = raw.__loopbridge_on_owner__
        make = channel_maker(raw.__loopbridge_ahead__)

        def stream(bound: _Bound, /, *args: Any, **kwargs: Any) -> Any:
            ch = make(on_owner, (bound.target, bound.opts, *args), kwargs, what, bound.opts)
            return BlockingStream._create(ch, bound.timeout)

        return stream
    if kind is MemberKind.PENDING:

        def pending(bound: _Bound, /, *args: Any, **kwargs: Any) -> Any:
            rule = bound.opts.ownership.returns[name]
            made = Pending(fn, (bound.target, *args), kwargs, rule, bound.opts, what, _own)
            return Blocking._create(made, bound.timeout)

        return pending
    return None


def blocking(p: T, *, timeout: float | None = None) -> Blocking[T]:
    """The blocking face of a proxy (or of a loop-affine object) for plain threads.

    Also takes what a sync member with a ``returns`` rule gave back through a
    proxy (a pending result): its face enters, iterates and waits for it.  A
    blocking face is returned unchanged (or, with a ``timeout``, a face of the
    same proxy with that timeout).  ``timeout``: each wait (a call, a stream's
    next item, a pending result) gives up after that many seconds with
    ``TimeoutError`` naming the operation, and the owner side is cancelled.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive (seconds) or None, not {timeout!r}")
    if type(p) is Blocking:
        if timeout is None:
            return cast("Blocking[T]", p)  # already the face, as proxy(p) of a proxy is p
        p = object.__getattribute__(p, "_lb_proxy")
    if type(p) is Pending:
        return cast("Blocking[T]", Blocking._create(p, timeout))
    if not getattr(type(p), "__loopbridge_proxy__", False):
        p = proxy(p)
    return cast("Blocking[T]", Blocking._create(p, timeout))
