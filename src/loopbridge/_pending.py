"""A sync member's loop-bound result, made on the owner loop when first used.

``session.get(url)`` (aiohttp), ``pool.acquire()`` (asyncpg) and a grpc
multicallable's ``__call__`` are sync methods whose result is bound to the
owner loop: some start work on the loop the moment they are called.  Through
a proxy, a member like that with a ``returns`` rule does not run where it is
called.  It gives back a :class:`Pending`, and the member runs on the owner
when the caller first does one of the three things such a result is for:

* ``await pending``: the result is awaited there, and what that gives follows
  the rule's ``"__await__"``;
* ``async with pending as x``: it is entered there (and later exited there), and
  ``x`` follows the rule's ``"__aenter__"`` (or the rule itself, when entering
  gives back the object);
* ``async for item in pending``: it is iterated there, as a stream, and each
  item follows the rule's ``"__anext__"``.  Left early, the iterator is closed
  there, and if the object is an operation in flight (it follows the future
  protocol: ``cancel``, ``cancelled``, ``done``, ``add_done_callback``, as a
  grpc.aio call and a future do, and goes on until cancelled) it is cancelled
  there.  Any other object's ``cancel()`` (an order's, a booking's) is its
  business and never called.

Invariants:

* the member runs at most once per :class:`Pending`, on the owner loop; every
  later use goes to the same object (``_obj`` is only read and written there);
* whatever comes back is shaped by the proxy layer's ``own`` function, given at
  construction: a proxy if a rule covers it, else the always-on check; plain
  data (``PLAIN``), which ``own`` gives back as it is under any rule, skips it;
* on the blocking face, a member whose result is a coroutine gives its value
  (:func:`call_on_owner`): a blocking call returns what awaiting it gives, on
  every Python, whether the member is a coroutine function or a plain function
  returning a coroutine (a wrapper marked as a coroutine function from 3.12 on).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from types import TracebackType
from typing import Any

from ._calls import Call, call_from_thread, route_call, route_exit
from ._operation import Options
from ._ownership import on_owner_thread
from ._ports import get_running_loop
from ._returns import PLAIN, Owned
from ._streams import BlockingStream, Channel, RemoteStream

__all__ = ["Pending", "Own", "MADE", "call_on_owner"]

#: How the proxy layer turns an owner-side value into what the caller gets:
#: ``own(value, rule, what, opts)``.
Own = Callable[[object, "Owned | None", str, Options], object]
#: How a use off the owner's thread is sent there: ``route_call``, or
#: ``route_exit`` for ``__aexit__``.
_Route = Callable[..., Awaitable[object]]
#: What runs on the owner for each use: ``fn(pending, *args)``.
_OnOwner = Callable[..., Awaitable[object]]

_UNMADE = object()


class Pending:
    """What a sync member with a ``returns`` rule gives back through a proxy.

    Awaitable, an async context manager and async-iterable, each run on the
    owner loop.  Its blocking face (``loopbridge.blocking(pending)``) is a
    context manager and an iterator, and its ``result()`` waits for what
    awaiting it gives.

    What awaiting, entering and iterating give is typed ``Any``: the member's
    result (or a proxy of it), an object of the user's whose members the caller
    uses as that object's own.
    """

    __slots__ = ("_fn", "_args", "_kwargs", "_rule", "_opts", "_what", "_own", "_obj", "ahead")

    def __init__(
        self,
        fn: Callable[..., object],
        args: tuple[object, ...],
        kwargs: dict[str, object],
        rule: Owned,
        opts: Options,
        what: str,
        own: Own,
    ) -> None:
        self._fn = fn
        self._args = args
        self._kwargs = kwargs
        self._rule = rule
        self._opts = opts
        self._what = what
        self._own = own
        # The member's result, the user's object, used by its protocol (awaited,
        # entered, iterated): owner side only.
        self._obj: Any = _UNMADE
        # Iterated, the object is made for this stream (and cancelled if left
        # early, see _iterate_on_owner): batched, unless loopbridge.read_ahead()
        # says otherwise.
        self.ahead: int | None = None

    def __repr__(self) -> str:
        return f"<loopbridge pending result of {self._what}>"

    # -- async faces -------------------------------------------------------------
    def __await__(self) -> Generator[object, None, Any]:
        return self._call(_await_on_owner, ()).__await__()

    def __aenter__(self) -> Awaitable[Any]:
        return self._call(_enter_on_owner, ())

    def __aexit__(
        self,
        et: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[bool | None]:
        return self._call(_exit_on_owner, (et, exc, tb), route_exit)

    def __aiter__(self) -> AsyncIterator[Any]:
        if on_owner_thread(self._opts.ownership):
            return _iterate_on_owner(self)
        ch = Channel(_iterate_on_owner, (self,), {}, self._what, self._opts, ahead=self.ahead)
        return RemoteStream(ch)

    def _call(
        self, fn: _OnOwner, args: tuple[object, ...], route: _Route = route_call
    ) -> Awaitable[Any]:
        opts = self._opts
        if on_owner_thread(opts.ownership):
            return fn(self, *args)
        return route(opts, get_running_loop(), fn, (self, *args), {}, self._what)

    # -- blocking faces (plain threads; see Blocking) ----------------------------
    # ``timeout``: the blocking face's (see loopbridge.blocking).
    def _blocking(self, fn: _OnOwner, args: tuple[object, ...], timeout: float | None) -> object:
        return call_from_thread(Call(fn, (self, *args), {}, self._what, self._opts), timeout)

    def result_blocking(self, timeout: float | None = None) -> object:
        return self._blocking(_await_on_owner, (), timeout)

    def enter_blocking(self, timeout: float | None = None) -> object:
        return self._blocking(_enter_on_owner, (), timeout)

    def exit_blocking(
        self, et: object, exc: object, tb: object, timeout: float | None = None
    ) -> object:
        return self._blocking(_exit_on_owner, (et, exc, tb), timeout)

    def iter_blocking(self, timeout: float | None = None) -> BlockingStream[Any]:
        ch = Channel(_iterate_on_owner, (self,), {}, self._what, self._opts, ahead=self.ahead)
        return BlockingStream._create(ch, timeout)


# ------------------------------------------------------------------ owner side
def _made(p: Pending) -> Any:
    obj = p._obj
    if obj is _UNMADE:
        obj = p._obj = p._fn(*p._args, **p._kwargs)
    return obj


class _Made:
    """What :func:`call_on_owner` gives when the member's result is for a later use."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<made: for its first use>"


MADE = _Made()


async def call_on_owner(p: Pending) -> object:
    """A blocking face's call of the member: it runs now, on the owner.

    A result that is a coroutine is only ever awaited (the member is a plain
    function returning one, as a pooled asyncpg connection's queries before
    Python 3.12 and redis-py's commands are): it is awaited here and its value,
    shaped as awaiting the pending result would shape it, comes back, so the
    blocking call gives the value, as a coroutine function's does.  Any other
    result (a context manager, an iterable, an awaitable object) stays made for
    its first use, and :data:`MADE` comes back.
    """
    obj = _made(p)
    if not inspect.iscoroutine(obj):
        return MADE
    return await _await_on_owner(p)


async def _await_on_owner(p: Pending) -> object:
    obj = _made(p)
    if not hasattr(type(obj), "__await__"):
        raise _lacks(p, obj, "__await__", "awaitable")
    value = await obj
    if type(value) in PLAIN:
        return value  # what own() gives plain data under any rule: itself (a unary RPC's reply)
    rule = p._rule if value is obj else p._rule.returns.get("__await__")
    return p._own(value, rule, f"awaiting {p._what}", p._opts)


def _lacks(p: Pending, obj: object, member: str, what: str) -> TypeError:
    return TypeError(
        f"{p._what} gave a {type(obj).__qualname__} object, which is not {what} "
        f"(its class has no {member})"
    )


async def _enter_on_owner(p: Pending) -> object:
    obj = _made(p)
    if not hasattr(type(obj), "__aenter__"):
        raise _lacks(p, obj, "__aenter__", "an async context manager")
    entered = await type(obj).__aenter__(obj)
    # Entering often gives back the object itself (a connection, a pipeline).
    rule = p._rule if entered is obj else p._rule.returns.get("__aenter__")
    return p._own(entered, rule, f"entering {p._what}", p._opts)


async def _exit_on_owner(p: Pending, et: object, exc: object, tb: object) -> object:
    obj = p._obj
    return await type(obj).__aexit__(obj, et, exc, tb)


async def _iterate_on_owner(p: Pending) -> AsyncIterator[object]:
    obj = _made(p)
    rule = p._rule.returns.get("__anext__")
    what = f"iterating {p._what}"
    if not hasattr(type(obj), "__aiter__"):
        raise _lacks(p, obj, "__aiter__", "async-iterable")
    it = obj.__aiter__()
    done = False
    try:
        async for item in it:
            yield p._own(item, rule, what, p._opts)
        done = True
    finally:
        if not done:
            # Left early (break, cancel, an error): stop it here, on its loop.
            # Closing the iterator is not always enough: an RPC or a future goes
            # on until cancelled, and ``cancel()`` is how such objects stop.
            aclose = getattr(it, "aclose", None)
            try:
                if aclose is not None:
                    await aclose()
            finally:
                if is_operation(obj):
                    obj.cancel()


#: What an operation in flight has (asyncio's and concurrent.futures' futures,
#: grpc.aio's calls): only such an object is cancelled when left early.  A
#: ``cancel()`` alone says nothing: an order or a booking has one too.
_FUTURE_PROTOCOL = ("cancel", "cancelled", "done", "add_done_callback")


def is_operation(obj: object) -> bool:
    """Whether ``obj`` follows the future protocol (it is an operation in flight)."""
    if isinstance(obj, (asyncio.Future, concurrent.futures.Future)):
        return True
    cls = type(obj)
    return all(callable(getattr(cls, name, None)) for name in _FUTURE_PROTOCOL)
