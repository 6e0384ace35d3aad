"""Special methods go through the proxy like any other member, or are refused.

Python calls special methods on the object's *type*, so a proxy that merely
inherited them would run them on the caller's thread: ``await p(1)`` would run
``__call__`` off the owner loop and return as if it were safe.  The drift guard
at the end derives the special method names from Python itself (every builtin
type and ``collections.abc`` ABC), so a name the data model grows is covered.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import collections.abc
import contextlib
import copy
import dataclasses
import math
import operator
import pickle
import re
import sys
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import _wakers
from loopbridge._faces import crossings_of
from loopbridge._members import PROXY_OWNED_DUNDERS


@lb.loop_affine
class Callable_:
    async def __call__(self, x: int) -> tuple[int, asyncio.AbstractEventLoop]:
        return x * 2, asyncio.get_running_loop()


@lb.loop_affine
class Countdown:
    """An async iterator object: a sync ``__aiter__`` returning self, state in ``self.n``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.stepped_on: set[asyncio.AbstractEventLoop] = set()

    def __aiter__(self) -> Countdown:
        return self

    async def __anext__(self) -> int:
        self.stepped_on.add(asyncio.get_running_loop())
        if self.n == 0:
            raise StopAsyncIteration
        self.n -= 1
        return self.n


@lb.loop_affine
class GenIter:
    async def __aiter__(self) -> AsyncIterator[str]:
        for word in ("a", "b"):
            yield word


@lb.loop_affine
class Sized:
    def __init__(self) -> None:
        self.items = [1, 2, 3]

    def __len__(self) -> int:
        return len(self.items)


@lb.loop_affine(threadsafe=("__len__",))
class DeclaredSized(Sized):
    pass


def _on(owner: lb.LoopThread, factory: Any, *args: Any) -> Any:
    async def make() -> Any:
        return factory(*args)

    return owner.run(make)


def test_async_call_runs_on_the_owner(owner: lb.LoopThread) -> None:
    p = lb.proxy(_on(owner, Callable_))

    async def main() -> tuple[int, asyncio.AbstractEventLoop]:
        return await p(21)

    value, ran_on = asyncio.run(main())
    assert value == 42 and ran_on is owner.loop
    assert lb.blocking(p).__call__(1) == (2, owner.loop)


def test_an_async_iterator_object_streams_from_its_owner(owner: lb.LoopThread) -> None:
    countdown = _on(owner, Countdown, 5)
    p = lb.proxy(countdown)

    async def main() -> list[int]:
        return [x async for x in p]

    assert asyncio.run(main()) == [4, 3, 2, 1, 0]
    assert countdown.stepped_on == {owner.loop}
    # The blocking face streams it too.
    again = lb.proxy(_on(owner, Countdown, 2))
    with lb.blocking(again).__aiter__() as items:
        assert list(items) == [1, 0]


def test_an_async_generator_aiter_streams(owner: lb.LoopThread) -> None:
    p = lb.proxy(_on(owner, GenIter))

    async def main() -> list[str]:
        return [x async for x in p]

    assert asyncio.run(main()) == ["a", "b"]


def test_a_sync_special_method_is_refused_by_name(owner: lb.LoopThread) -> None:
    p = lb.proxy(_on(owner, Sized))
    with pytest.raises(
        lb.LoopAffinityError,
        match=r"^Sized\.__len__ is refused through a proxy: declare `threadsafe",
    ):
        len(p)
    with pytest.raises(lb.LoopAffinityError, match=r"threadsafe=\('__len__',\)"):
        bool(p)  # truth testing calls __len__ too
    assert len(lb.proxy(_on(owner, DeclaredSized))) == 3  # declared: used directly


def test_a_proxy_still_refuses_pickling_whatever_the_class_defines(owner: lb.LoopThread) -> None:
    class Picklable:
        def __reduce_ex__(self, protocol: Any) -> Any:
            return (Picklable, ())

    obj = _on(owner, Picklable)
    lb.adopt(obj, loop=owner.loop)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(lb.proxy(obj))


def _data_model_names() -> set[str]:
    """Every special *method* name that Python's builtin types, ``types``, ``contextlib``
    and ``collections.abc`` define."""
    names: set[str] = set()
    sources: list[Any] = [v for v in vars(builtins).values() if isinstance(v, type)]
    for module in (collections.abc, contextlib, types):
        sources += [v for v in vars(module).values() if isinstance(v, type)]
    for src in sources:
        for n in dir(src):
            if n.startswith("__") and n.endswith("__"):
                value = getattr(src, n, None)
                if callable(value) and not isinstance(value, type):  # methods, not data
                    names.add(n)
    return names


def _host(p: Any) -> Any:
    """A class with ``p`` as a class attribute (descriptor protocol, ``__set_name__``)."""
    return type("Host", (), {"attr": p})


def _assign(p: Any) -> None:
    x = p
    x += 1  # __iadd__ and friends


def _set_name(p: Any) -> None:
    try:
        _host(p)
    except RuntimeError as exc:  # before 3.12 type() wraps what __set_name__ raised
        if isinstance(exc.__cause__, lb.LoopAffinityError):
            raise exc.__cause__ from None
        raise


def _delete(host: Any) -> None:
    del host().attr


def _plain(name: str) -> Any:
    """No operator: Python calls it only by name (copy, pickle, metaclasses)."""
    return lambda p: getattr(type(p), name)(p)


#: How Python itself invokes each special method on an object: the operator, the
#: builtin or the statement.  The drift guard applies these to a proxy.
OPERATORS: dict[str, Any] = {
    "__abs__": abs,
    "__add__": lambda p: p + 1,
    "__radd__": lambda p: 1 + p,
    "__iadd__": _assign,
    "__and__": lambda p: p & 1,
    "__rand__": lambda p: 1 & p,
    "__iand__": lambda p: operator.iand(p, 1),
    "__or__": lambda p: p | 1,
    "__ror__": lambda p: 1 | p,
    "__ior__": lambda p: operator.ior(p, 1),
    "__xor__": lambda p: p ^ 1,
    "__rxor__": lambda p: 1 ^ p,
    "__ixor__": lambda p: operator.ixor(p, 1),
    "__sub__": lambda p: p - 1,
    "__rsub__": lambda p: 1 - p,
    "__isub__": lambda p: operator.isub(p, 1),
    "__mul__": lambda p: p * 1,
    "__rmul__": lambda p: 1 * p,
    "__imul__": lambda p: operator.imul(p, 1),
    "__truediv__": lambda p: p / 1,
    "__rtruediv__": lambda p: 1 / p,
    "__floordiv__": lambda p: p // 1,
    "__rfloordiv__": lambda p: 1 // p,
    "__mod__": lambda p: p % 1,
    "__rmod__": lambda p: 1 % p,
    "__divmod__": lambda p: divmod(p, 1),
    "__rdivmod__": lambda p: divmod(1, p),
    "__pow__": lambda p: p**1,
    "__rpow__": lambda p: 1**p,
    "__lshift__": lambda p: p << 1,
    "__rlshift__": lambda p: 1 << p,
    "__rshift__": lambda p: p >> 1,
    "__rrshift__": lambda p: 1 >> p,
    "__neg__": lambda p: -p,
    "__pos__": lambda p: +p,
    "__invert__": lambda p: ~p,
    "__eq__": lambda p: p == p,
    "__ne__": lambda p: p != p,
    "__lt__": lambda p: p < p,
    "__le__": lambda p: p <= p,
    "__gt__": lambda p: p > p,
    "__ge__": lambda p: p >= p,
    "__hash__": hash,
    "__bool__": bool,
    "__len__": len,
    "__length_hint__": operator.length_hint,
    "__iter__": iter,
    "__next__": next,
    "__reversed__": reversed,
    "__contains__": lambda p: 1 in p,
    "__getitem__": lambda p: p[0],
    "__setitem__": lambda p: operator.setitem(p, 0, 1),
    "__delitem__": lambda p: operator.delitem(p, 0),
    "__call__": lambda p: p(),
    # `with` and `async with` need both halves; a class with one is no context manager.
    "__enter__": _plain("__enter__"),
    "__exit__": _plain("__exit__"),
    "__index__": operator.index,
    "__int__": int,
    "__float__": float,
    "__complex__": complex,
    "__bytes__": bytes,
    "__round__": round,
    "__trunc__": math.trunc,
    "__floor__": math.floor,
    "__ceil__": math.ceil,
    "__str__": str,
    "__format__": lambda p: format(p, ""),
    "__dir__": dir,
    "__sizeof__": sys.getsizeof,
    "__copy__": copy.copy,
    "__get__": lambda p: _host(p).attr,
    "__set__": lambda p: setattr(_host(p)(), "attr", 1),
    "__delete__": lambda p: _delete(_host(p)),
    "__set_name__": _set_name,
    "__instancecheck__": lambda p: isinstance(1, p),
    "__subclasscheck__": lambda p: issubclass(int, p),
    "__mro_entries__": lambda p: types.new_class("Sub", (p,)),
    "__aenter__": _plain("__aenter__"),
    "__aexit__": _plain("__aexit__"),
    "__anext__": lambda p: asyncio.run(anext(p)),
    "__buffer__": memoryview,  # 3.12+
    # Called by name only: there is no operator for these (some only on some Pythons).
    **{n: _plain(n) for n in ("__release_buffer__", "__replace__", "__setformat__")},
    **{n: _plain(n) for n in ("__alloc__", "__getformat__", "__getnewargs__", "__getstate__")},
    **{n: _plain(n) for n in ("__setstate__", "__prepare__", "__subclasses__")},
}


def test_drift_guard_no_special_method_is_inherited_silently(owner: lb.LoopThread) -> None:
    """For each special method name Python knows, a class that defines it as a
    sync function gets a proxy whose *operator* raises LoopAffinityError naming it
    (a sync ``__aiter__`` streams and a sync ``__await__`` is awaited on the
    owner), and as an async function a marshalled member, unless the proxy
    defines it itself.  The operators are applied for real: CPython's slots
    swallow an error raised while a special method is looked up, so a refusing
    attribute alone would let ``==`` give ``False`` and ``hash`` "unhashable"."""
    names = _data_model_names()
    assert {"__call__", "__len__", "__aiter__", "__anext__", "__aenter__", "__eq__"} <= names
    assert not names - PROXY_OWNED_DUNDERS - {"__aiter__", "__await__"} - set(OPERATORS), (
        "a special method name Python grew has no operator in OPERATORS: add how Python calls it"
    )
    for name in sorted(names - PROXY_OWNED_DUNDERS):

        def sync(self: Any, *args: Any, _name: str = name) -> Any:
            raise AssertionError(f"{_name} ran on the caller's side")

        async def async_(self: Any, *args: Any) -> Any:
            return asyncio.get_running_loop()

        for fn, want in ((sync, "refused"), (async_, "marshalled")):
            cls = type(f"Has{name.strip('_').title()}", (), {name: fn})
            obj = _on(owner, cls)
            lb.adopt(obj, loop=owner.loop)
            p = lb.proxy(obj)
            if not callable(getattr(cls, name, None)) or isinstance(
                cls.__dict__[name], (staticmethod, classmethod)
            ):
                continue  # made a class or static method by Python itself (__new__...)
            member = type(p).__dict__.get(name)
            assert member is not None, f"{name} ({want}) is inherited as is"
            crossing = crossings_of(type(p)).get(name)
            if want == "marshalled" or name in ("__aiter__", "__await__"):
                assert crossing is not None, f"{name} ({want}) is not marshalled"
                continue
            with pytest.raises(lb.LoopAffinityError, match=re.escape(f"{cls.__qualname__}.{name}")):
                OPERATORS[name](p)


@dataclasses.dataclass(order=True)
class Point:
    x: int
    y: int


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: int


@pytest.mark.parametrize(
    "make, ops",
    [
        # (`!=` is object's __ne__, which calls __eq__: the error names __eq__.)
        (lambda: Point(1, 2), ["__eq__", "__lt__", "__le__", "__gt__", "__ge__"]),
        (lambda: Frozen(1), ["__eq__", "__hash__"]),
        (lambda: collections.deque([1, 2]), ["__len__", "__iter__", "__eq__", "__contains__"]),
        (lambda: collections.deque([1, 2]), ["__reversed__", "__add__", "__getitem__", "__copy__"]),
    ],
)
def test_operators_through_a_proxy_raise_naming_the_special_method(
    owner: lb.LoopThread, make: Any, ops: list[str]
) -> None:
    """Dataclasses and a C type (deque): ``pa == pb`` used to give ``False`` for two
    equal points, ``<``, ``hash()`` and ``iter()`` Python's plain TypeError, and a
    deque's proxy its own empty deque's answers."""

    async def adopted() -> Any:
        return lb.adopt(make())

    p, q = lb.proxy(owner.run(adopted)), lb.proxy(owner.run(adopted))
    assert isinstance(p, type(lb.unwrap(p)))
    for name in ops:
        with pytest.raises(lb.LoopAffinityError, match=re.escape(name)):
            OPERATORS[name](p)
    if "__eq__" in ops:
        with pytest.raises(lb.LoopAffinityError, match="__eq__"):
            assert p == q
        with pytest.raises(lb.LoopAffinityError, match=r"__(eq|ne)__"):
            assert p != q


def test_an_unhashable_class_stays_unhashable_through_its_proxy(owner: lb.LoopThread) -> None:
    """``__hash__ = None`` (a dataclass with eq) is no method: the proxy has the
    object's own effect, Python's TypeError, as it is safe."""

    async def adopted() -> Any:
        return lb.adopt(Point(1, 2))

    with pytest.raises(TypeError, match="unhashable"):
        hash(lb.proxy(owner.run(adopted)))


@lb.loop_affine
class Lease:
    """An async context manager whose exit cleans up across an await, shielded
    as asyncpg's pool release is."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self._release())

    async def _release(self) -> None:
        await asyncio.sleep(0)  # a round trip to the server, say
        self.released.set()


@pytest.mark.parametrize("runtime", ["trio", "anyio-asyncio"])
def test_an_exit_in_a_cancelled_scope_still_runs_to_completion(
    owner: lb.LoopThread, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel scope cancels every await, the proxied __aexit__'s included; the
    exit must still run on the owner, as it would natively."""
    anyio = pytest.importorskip("anyio", reason="anyio comes with the test group")
    # The cancelled caller waits for the exit only while the owner answers its
    # probes within UNRESPONSIVE_S (0.2 s); on a loaded machine the owner's thread
    # can go unscheduled for longer, and the caller then (rightly) goes on without
    # it.  This test is about the wait, not that bound (tests/core/test_timeouts.py).
    monkeypatch.setattr(_wakers, "UNRESPONSIVE_S", 60.0)
    if runtime == "trio":
        pytest.importorskip("trio", reason="the trio extra is not installed")
    lease = _on(owner, Lease)
    p = lb.proxy(lease)

    async def main() -> None:
        with anyio.CancelScope() as scope:
            async with p:
                scope.cancel()  # cancelled inside the body: the exit runs cancelled
                await anyio.sleep(1)  # a checkpoint: the cancel lands here
        assert scope.cancelled_caught

    anyio.run(main, backend="trio" if runtime == "trio" else "asyncio")
    if runtime == "trio":
        # trio's wait for the exit is shielded: it finished before the cancel went on.
        assert lease.released.is_set()

    # Whatever the caller did, the exit ran on the owner, its cleanup included
    # (under anyio on asyncio the caller stops waiting at the scope's next
    # cancel, as it would natively around a shielded cleanup).
    async def released() -> None:
        await asyncio.wait_for(lease.released.wait(), 30)  # a hang guard

    owner.run(released)
