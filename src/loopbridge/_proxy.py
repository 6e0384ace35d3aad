"""The two faces of a loop-affine object: ``proxy`` (awaitable) and ``blocking``.

``proxy(obj)`` returns an instance of a generated subclass of ``type(obj)`` whose
every member is replaced by a marshalling or refusing one, so
``isinstance(p, type(obj))`` holds and abstract base classes (vLLM's
``EngineClient``) accept it.  The proxy never runs the base class's ``__init__``
or ``__del__``.  Member kinds come from :func:`~loopbridge._members.classify`;
generated classes are cached per (class, declarations).
"""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar, cast

from ._affinity import original
from ._calls import Call, call_from_async, call_from_thread
from ._codegen import build
from ._construction import NoPublicConstructor
from ._errors import LoopAffinityError
from ._members import MemberKind, classify
from ._metrics import Metrics
from ._operation import Options
from ._ownership import ON_OWNER, ON_OWNER_LOOP, ON_OWNER_THREAD, Ownership, ownership_of
from ._ports import get_running_loop
from ._streams import BlockingStream, Channel, RemoteStream
from ._trio import in_trio_run, trio_port
from ._wakers import loop_waker, trio_waker

__all__ = [
    "proxy",
    "blocking",
    "Blocking",
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
# owner loop it calls straight through; anywhere else _route decides.
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
            {self}, __lb_loop, __lb_fn, ({self}._lb_target, {positional}), {keywords}, __lb_what
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
        __lb_route=_route,
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


def _route(
    p: Any,
    loop: asyncio.AbstractEventLoop | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
) -> Any:
    """A proxy member called off the owner loop, from ``loop`` (the running one)."""
    if loop is None:
        # No loop yet (the coroutine was made before asyncio.run, or under
        # trio): decide when it is awaited.
        return _route_on_await(p, fn, args, kwargs, what)
    return call_from_async(loop_waker(loop), p._lb_opts, fn, args, kwargs, what)


async def _route_on_await(
    p: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], what: str
) -> Any:
    loop = get_running_loop()
    if loop is not None:
        if loop is p._lb_ownership.owner.loop:
            return await fn(*args, **kwargs)
        return await _route(p, loop, fn, args, kwargs, what)
    if in_trio_run():
        return await call_from_async(trio_waker(trio_port()), p._lb_opts, fn, args, kwargs, what)
    raise LoopAffinityError(f"awaiting {what} through a proxy needs a running asyncio loop or trio")


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
    name: str, fn: Callable[..., Any], what: str | None = None
) -> Callable[..., Any]:
    member = build(
        _STREAM_MEMBER,
        fn,
        "proxy stream member",
        __lb_fn=fn,
        __lb_ident=threading.get_ident,
        __lb_grl=get_running_loop,
        __lb_stream=RemoteStream,
        __lb_channel=Channel,
        __lb_what=what or f"{fn.__qualname__}()",
    )
    return _describe(member, name, fn, MemberKind.STREAM)


async def _iterate(self: Any) -> AsyncIterator[Any]:
    """The object's own async iteration (its ``__aiter__`` and ``__anext__``), as
    an async generator that a proxy streams: it runs on the owner loop."""
    async for item in self:
        yield item


def _iteration_member(cls: type, raw: Any) -> Callable[..., Any]:
    member = _stream_member("__aiter__", _iterate, f"iterating a {cls.__qualname__} object")
    member.__qualname__ = f"{cls.__qualname__}.__aiter__"
    member.__doc__ = raw.__doc__
    return member


class _Passthrough:
    """A declared stable / thread-safe member: read from the target directly."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return getattr(object.__getattribute__(obj, "_lb_target"), self.name)


class _Refused:
    """A sync member nobody declared safe: touching it through a proxy is an error."""

    __slots__ = ("name", "owner_name")

    def __init__(self, name: str, owner_name: str) -> None:
        self.name = name
        self.owner_name = owner_name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        raise _refusal(self.owner_name, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        raise _refusal(self.owner_name, self.name)


def _refusal(cls_name: str, name: str) -> LoopAffinityError:
    if name.startswith("__") and name.endswith("__"):
        return LoopAffinityError(
            f"{cls_name}.{name} is a sync special method: Python would run it on the calling "
            "thread, off the owner loop, so the proxy refuses it. Call an async method that "
            f"does the same work on the owner, or, if {name} touches no loop-bound state, "
            f"declare it threadsafe=({name!r},) (in @loop_affine(...) or adopt(...))."
        )
    return LoopAffinityError(
        f"{cls_name}.{name} is a sync member and is not declared safe from other threads, so "
        "the proxy refuses it. If it is set once at setup and only read, declare it "
        f"stable=({name!r},); if it may be called from any thread, declare it "
        f"threadsafe=({name!r},) (in @loop_affine(...) or adopt(...))."
    )


# --------------------------------------------------------------- proxy class
_cache: dict[tuple[type, frozenset[str], frozenset[str]], type] = {}
_cache_lock = threading.Lock()


def _proxy_class(cls: type, ownership: Ownership) -> type:
    key = (cls, ownership.stable, ownership.threadsafe)
    pcls = _cache.get(key)
    if pcls is not None:
        return pcls
    ns: dict[str, Any] = {"__slots__": _SLOTS, "__loopbridge_proxy__": True}
    for name, (kind, raw) in classify(cls, ownership).items():
        if kind is MemberKind.ASYNC:
            ns[name] = _async_member(name, original(raw))
        elif kind is MemberKind.STREAM:
            ns[name] = _stream_member(name, original(raw))
        elif kind is MemberKind.ITERATION:
            ns[name] = _iteration_member(cls, raw)
        elif kind in (MemberKind.STABLE, MemberKind.THREADSAFE):
            ns[name] = _Passthrough(name)
        elif kind is MemberKind.SYNC:
            ns[name] = _Refused(name, cls.__qualname__)
        # CLASS_LEVEL: inherited as is.
    ns["__getattribute__"] = object.__getattribute__  # members are the class's, above
    ns["__getattr__"] = _instance_attr
    ns["__setattr__"] = _no_setattr
    ns["__delattr__"] = _no_setattr
    ns["__repr__"] = _repr
    ns["__del__"] = _no_del
    ns["__init__"] = _no_init
    ns["__reduce__"] = _no_reduce
    ns["__reduce_ex__"] = _no_reduce_ex
    try:
        pcls = type(cls)(f"{cls.__name__}Proxy", (cls,), ns)
    except TypeError:
        # Not subclassable (final, C layout, slot conflicts): a plain proxy class.
        ns["__slots__"] = _SLOTS
        pcls = type(f"{cls.__name__}Proxy", (), ns)
    pcls.__module__ = cls.__module__
    pcls.__qualname__ = f"{cls.__qualname__}Proxy"
    with _cache_lock:
        _cache.setdefault(key, pcls)
    return _cache[key]


def _instance_attr(self: Any, name: str) -> Any:
    """Instance attributes (set in ``__init__``) that no class member describes."""
    get = object.__getattribute__
    ownership: Ownership = get(self, "_lb_ownership")
    target = get(self, "_lb_target")
    if name in ownership.stable or name in ownership.threadsafe:
        return getattr(target, name)
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if not hasattr(target, name):
        raise AttributeError(f"{type(target).__qualname__!r} object has no attribute {name!r}")
    raise _refusal(type(target).__qualname__, name)


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
    pcls = _proxy_class(type(obj), ownership)
    p = cast(T, object.__new__(pcls))  # an instance of a subclass of type(obj)
    setattr_ = object.__setattr__
    setattr_(p, "_lb_target", obj)
    setattr_(p, "_lb_ownership", ownership)
    setattr_(p, "_lb_opts", Options(ownership, stream_window, cancel_grace, bool(eager)))
    return p


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
    """

    __slots__ = ("_lb_proxy", "_lb_members")
    _lb_factory = "loopbridge.blocking()"

    def __init__(self, p: T) -> None:
        object.__setattr__(self, "_lb_proxy", p)
        object.__setattr__(self, "_lb_members", {})

    def __getattr__(self, name: str) -> Any:
        get = object.__getattribute__
        p = get(self, "_lb_proxy")
        members: dict[str, Any] = get(self, "_lb_members")
        member = members.get(name)
        if member is not None:
            return member
        unbound = _blocking_member(type(p), name)
        if unbound is None:
            return getattr(p, name)  # passthrough, or the proxy's own refusal
        member = members[name] = types.MethodType(
            unbound, _Bound(get(p, "_lb_target"), get(p, "_lb_opts"))
        )
        return member

    def __setattr__(self, name: str, value: Any) -> None:
        _no_setattr(self, name)

    def __repr__(self) -> str:
        return f"<loopbridge blocking face of {object.__getattribute__(self, '_lb_proxy')!r}>"


class _Bound:
    """What a blocking member is bound to: the target and its proxy's settings."""

    __slots__ = ("target", "opts")

    def __init__(self, target: Any, opts: Options) -> None:
        self.target = target
        self.opts = opts


# The blocking face's members, rendered from the proxy member's original with
# the same signature machinery; ``{self}`` is a _Bound.
_BLOCKING_CALL = """
def make({make_params}):
    def member({params}):
        return __lb_run(
            __lb_call(__lb_fn, ({self}.target, {positional}), {keywords}, __lb_what, {self}.opts)
        )
    return member
"""
_BLOCKING_STREAM = """
def make({make_params}):
    def member({params}):
        return __lb_stream(
            __lb_channel(__lb_fn, ({self}.target, {positional}), {keywords}, __lb_what, {self}.opts)
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
            __lb_channel=Channel,
            __lb_what=f"{fn.__qualname__}()",
        )
    if member is not None:
        member.__name__ = name
        member.__qualname__ = fn.__qualname__  # type: ignore[union-attr]
        member.__doc__ = fn.__doc__
        annotations = dict(getattr(fn, "__annotations__", {}))
        if kind is MemberKind.STREAM:  # a BlockingStream, not the async iterator
            annotations.pop("return", None)
        member.__annotations__ = annotations
    _blocking_members.setdefault(key, member)
    return _blocking_members[key]


def blocking(p: T) -> Blocking[T]:
    """The blocking face of a proxy (or of a loop-affine object) for plain threads."""
    if not getattr(type(p), "__loopbridge_proxy__", False):
        p = proxy(p)
    return cast("Blocking[T]", Blocking._create(p))
