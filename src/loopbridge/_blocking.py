"""The blocking face of a loop-affine object: ``blocking(p)``, for plain threads.

Its members are built from what the proxy class records of each marshalled
member (its :class:`~loopbridge._faces.Crossing`): a call blocks the calling
thread until the owner loop answers, a stream becomes a blocking iterator, a
pending result a face of its own, and awaiting the object ``result()``.
Members with no crossing (passed through, refused) are the proxy's own.
A blocking call returns the value on every Python, including a sync member's
with a ``returns`` rule whose result is a coroutine (see ``_pending``).

Invariants:

* only the calling thread blocks; using a face on the owner loop's thread
  raises instead of deadlocking (see ``call_from_thread``);
* a face's members are built once per (proxy class, name) and bound once per
  face; a member is what its crossing says, never what the proxy's function
  objects look like.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from ._calls import Call, call_from_thread
from ._codegen import build
from ._construction import NoPublicConstructor
from ._faces import Crossing, Wait, channel_maker, crossings_of
from ._operation import Options
from ._pending import MADE, Pending, call_on_owner
from ._proxy import (
    BlockingMembers,
    PendingFactory,
    blocking_members,
    is_proxy,
    proxy,
    refuse_setattr,
    result_by_rule,
)
from ._streams import BlockingStream
from ._uncovered import is_uncovered

__all__ = ["Blocking", "blocking"]

T = TypeVar("T")


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
        # Without a timeout, every face of a proxy binds its members once (see
        # blocking_members): ``blocking(p).m(...)`` per request costs no binding.
        members = blocking_members(p) if timeout is None else {}
        object.__setattr__(self, "_lb_members", members)
        object.__setattr__(self, "_lb_timeout", timeout)

    def __getattr__(self, name: str) -> Any:
        get = object.__getattribute__
        p = get(self, "_lb_proxy")
        timeout: float | None = get(self, "_lb_timeout")
        if type(p) is Pending:
            if name == "result":
                return lambda: p.result_blocking(timeout)
            raise AttributeError(f"a pending result's blocking face has no {name!r}")
        members: BlockingMembers = get(self, "_lb_members")
        member = members.get(name)
        if member is not None:
            return member
        kept = members.get((name,))  # an owned data member's face (see _face_of_value)
        if kept is not None:
            value, face = cast("tuple[object, Blocking[Any]]", kept)
            if getattr(p, name) is value:
                return face
        unbound = _blocking_member(type(p), name)
        if unbound is None:
            return _face_of_value(p, name, timeout, members)
        member = members[name] = types.MethodType(
            unbound, _Bound(get(p, "_lb_target"), get(p, "_lb_opts"), timeout)
        )
        return member

    def __call__(self, *args: object, **kwargs: object) -> Any:
        member = object.__getattribute__(self, "_lb_members").get("__call__")
        if member is None:
            member = self.__getattr__("__call__")
        return member(*args, **kwargs)

    def __enter__(self) -> Any:
        p = object.__getattribute__(self, "_lb_proxy")
        if type(p) is Pending:
            return p.enter_blocking(object.__getattribute__(self, "_lb_timeout"))
        return self.__getattr__("__aenter__")()

    def __exit__(self, et: object, exc: object, tb: object) -> Any:
        p = object.__getattribute__(self, "_lb_proxy")
        if type(p) is Pending:
            return p.exit_blocking(et, exc, tb, object.__getattribute__(self, "_lb_timeout"))
        return self.__getattr__("__aexit__")(et, exc, tb)

    def __iter__(self) -> Any:
        p = object.__getattribute__(self, "_lb_proxy")
        if type(p) is Pending:
            return p.iter_blocking(object.__getattribute__(self, "_lb_timeout"))
        return self.__getattr__("__aiter__")()

    def __setattr__(self, name: str, value: object) -> None:
        refuse_setattr(self, name)

    def __repr__(self) -> str:
        return f"<loopbridge blocking face of {object.__getattribute__(self, '_lb_proxy')!r}>"


def _face_of_value(p: object, name: str, timeout: float | None, members: BlockingMembers) -> object:
    """A member that is not marshalled: passed through (or the proxy's own refusal);
    an owned data member and a pending factory give blocking faces too.

    An owned data member's face is kept beside the bound members (under
    ``(name,)``) while the member gives the same proxy (the proxy keeps the one
    it made while the attribute holds the same object): ``blocking(stub).Say``
    once per request builds no face.  The face holds that proxy, never ``p``.
    """
    value = getattr(p, name)
    if name in object.__getattribute__(p, "_lb_ownership").returns:
        if is_proxy(value):  # an owned data member: its face too
            kept = cast("tuple[object, Blocking[Any]] | None", members.get((name,)))
            if kept is not None and kept[0] is value:
                return kept[1]
            face = _face(value, blocking_members(value) if timeout is None else {}, timeout)
            members[(name,)] = (value, face)
            return face
        if type(value) is PendingFactory:
            factory = value
            return lambda *a, **k: _face(factory(*a, **k), {}, timeout)
    return value


def _face(p: object, members: BlockingMembers, timeout: float | None) -> Blocking[Any]:
    """A face of ``p`` (a proxy, an uncovered object or a pending result) without
    the checks of :func:`blocking`: once per request on the recipes' paths."""
    face: Blocking[Any] = object.__new__(Blocking)
    _set_proxy(face, p)
    _set_members(face, members)
    _set_timeout(face, timeout)
    return face


_set_proxy = Blocking._lb_proxy.__set__  # type: ignore[attr-defined]
_set_members = Blocking._lb_members.__set__  # type: ignore[attr-defined]
_set_timeout = Blocking._lb_timeout.__set__  # type: ignore[attr-defined]


class _Bound:
    """What a blocking member is bound to: the target, its proxy's settings and the
    face's timeout."""

    __slots__ = ("target", "opts", "timeout")

    def __init__(self, target: object, opts: Options, timeout: float | None) -> None:
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
_blocking_members: dict[tuple[type, str], Callable[..., object] | None] = {}


def _blocking_member(pcls: type, name: str) -> Callable[..., object] | None:
    """The unbound blocking member ``name`` of proxy class ``pcls`` (None: not marshalled)."""
    key = (pcls, name)
    try:
        return _blocking_members[key]
    except KeyError:
        pass
    crossings = crossings_of(pcls)
    crossing = crossings.get(name)
    member: Callable[..., object] | None = None
    if crossing is not None and crossing.wait is not Wait.RESULT:
        member = _WAITS[crossing.wait](crossing, name)
        fn = crossing.source
        member.__name__ = name
        member.__qualname__ = fn.__qualname__
        member.__doc__ = fn.__doc__
        annotations = dict(getattr(fn, "__annotations__", {}))
        if crossing.wait is Wait.STREAM and not crossing.with_opts:
            annotations.pop("return", None)  # a BlockingStream, not the async iterator
        member.__annotations__ = annotations
    elif crossing is None and name == "result":
        member = _blocking_result(pcls, crossings.get("__await__"))  # named by itself
    _blocking_members.setdefault(key, member)
    return _blocking_members[key]


def _call(crossing: Crossing, name: str) -> Callable[..., object]:
    fn, on_owner = crossing.source, crossing.on_owner
    what = f"{fn.__qualname__}()"
    if not crossing.with_opts:
        return build(
            _BLOCKING_CALL,
            fn,
            "blocking member",
            __lb_fn=fn,
            __lb_run=call_from_thread,
            __lb_call=Call,
            __lb_what=what,
        )

    def call(bound: _Bound, /, *args: object, **kwargs: object) -> object:
        c = Call(on_owner, (bound.target, bound.opts, *args), kwargs, what, bound.opts)
        return call_from_thread(c, bound.timeout)

    return call


def _stream(crossing: Crossing, name: str) -> Callable[..., object]:
    fn, on_owner = crossing.source, crossing.on_owner
    what = f"{fn.__qualname__}()"
    make = channel_maker(crossing.ahead)
    if not crossing.with_opts:
        return build(
            _BLOCKING_STREAM,
            fn,
            "blocking stream member",
            __lb_fn=fn,
            __lb_stream=BlockingStream._create,
            __lb_channel=make,
            __lb_what=what,
        )

    def stream(bound: _Bound, /, *args: object, **kwargs: object) -> object:
        ch = make(on_owner, (bound.target, bound.opts, *args), kwargs, what, bound.opts)
        return BlockingStream._create(ch, bound.timeout)

    return stream


def _pending(crossing: Crossing, name: str) -> Callable[..., object]:
    """A sync member with a returns rule, on the blocking face.

    A blocking call returns the value, on every Python: a member whose result is a
    coroutine (a plain function returning one) gives what awaiting it gives.  That
    is only known once the member has run on the owner, so the call runs it there
    (one crossing: the same as ``.result()`` would make).  A member whose result was
    something else (a context manager, an iterable: entered or iterated next) gives
    its pending result's face, and from then on the call runs nothing until that
    first use, which is one crossing too.
    """
    fn, rule = crossing.source, crossing.rule
    what = f"{fn.__qualname__}()"
    assert rule is not None
    coroutines = [True]  # until the member gives something else (read without a lock)

    def pending(bound: _Bound, /, *args: object, **kwargs: object) -> object:
        made = Pending(fn, (bound.target, *args), kwargs, rule, bound.opts, what, result_by_rule)
        if coroutines[0]:
            value = call_from_thread(
                Call(call_on_owner, (made,), {}, what, bound.opts), bound.timeout
            )
            if value is not MADE:
                return value
            coroutines[0] = False
        return _face(made, {}, bound.timeout)

    return pending


#: How the blocking face waits for each kind of crossing (awaiting the object
#: itself is ``result()``, made by _blocking_result).
_WAITS: dict[Wait, Callable[[Crossing, str], Callable[..., object]]] = {
    Wait.CALL: _call,
    Wait.STREAM: _stream,
    Wait.PENDING: _pending,
}


def _blocking_result(pcls: type, await_: Crossing | None) -> Callable[..., object] | None:
    """``blocking(p).result()`` of an awaitable proxy (a future's, say): waits for what
    awaiting it gives.  None where awaiting the object is not marshalled."""
    if await_ is None:
        return None
    on_owner = await_.on_owner
    what = f"awaiting a {pcls.__qualname__.removesuffix('Proxy')} object"

    def result(bound: _Bound, /) -> object:
        c = Call(on_owner, (bound.target, bound.opts), {}, what, bound.opts)
        return call_from_thread(c, bound.timeout)

    result.__qualname__ = f"{pcls.__qualname__}.result"
    result.__doc__ = "Block until awaiting the object on its owner loop gives its result."
    return result


def blocking(p: T, *, timeout: float | None = None) -> Blocking[T]:
    """The blocking face of a proxy (or of a loop-affine object) for plain threads.

    Also takes what a sync member with a ``returns`` rule gave back through a
    proxy (a pending result): its face enters, iterates and waits for it.  A
    blocking face is returned unchanged (or, with a ``timeout``, a face of the
    same proxy with that timeout).  ``timeout``: each wait (a call, a stream's
    next item, a pending result) gives up after that many seconds with
    ``TimeoutError`` naming the operation, and the owner side is cancelled.
    """
    if timeout is None and is_proxy(p):  # the common case: one face per request
        return _face(p, blocking_members(p), None)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive (seconds) or None, not {timeout!r}")
    if type(p) is Blocking:
        if timeout is None:
            return cast("Blocking[T]", p)  # already the face, as proxy(p) of a proxy is p
        p = object.__getattribute__(p, "_lb_proxy")
    if type(p) is Pending:
        return cast("Blocking[T]", Blocking._create(p, timeout))
    if not (is_proxy(p) or is_uncovered(p)):
        p = proxy(p)
    return cast("Blocking[T]", Blocking._create(p, timeout))
