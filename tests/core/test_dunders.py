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
import collections.abc
import contextlib
import pickle
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

import loopbridge as lb
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
    with pytest.raises(lb.LoopAffinityError, match=r"Sized\.__len__ is a sync special method"):
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


def test_drift_guard_no_special_method_is_inherited_silently(owner: lb.LoopThread) -> None:
    """For each special method name Python knows, a class that defines it as a
    sync function gets a refusing proxy attribute (a sync ``__aiter__`` streams and a
    sync ``__await__`` is awaited on the owner), and as an async function a
    marshalled member, unless the proxy defines it itself."""
    names = _data_model_names()
    assert {"__call__", "__len__", "__aiter__", "__anext__", "__aenter__", "__eq__"} <= names
    for name in sorted(names - PROXY_OWNED_DUNDERS):

        def sync(self: Any, *args: Any) -> Any:
            return None  # never called: only the proxy class is inspected

        async def async_(self: Any, *args: Any) -> Any:
            return asyncio.get_running_loop()

        for fn, want in ((sync, "refused"), (async_, "marshalled")):
            cls = type(f"Has{name.strip('_').title()}", (), {name: fn})
            obj = _on(owner, cls)
            lb.adopt(obj, loop=owner.loop)
            pcls = type(lb.proxy(obj))
            if not callable(getattr(cls, name, None)) or isinstance(
                cls.__dict__[name], (staticmethod, classmethod)
            ):
                continue  # made a class or static method by Python itself (__new__...)
            member = pcls.__dict__.get(name)
            assert member is not None, f"{name} ({want}) is inherited as is"
            kind = getattr(member, "__loopbridge_kind__", None)
            if want == "marshalled":
                assert kind is not None, f"async {name} is not marshalled"
            elif name == "__aiter__":
                assert kind is not None, "a sync __aiter__ does not stream the iteration"
            elif name == "__await__":
                assert kind is not None, "a sync __await__ does not marshal awaiting"
            else:
                assert type(member).__name__ == "_Refused", f"sync {name} is not refused"


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
    owner: lb.LoopThread, runtime: str
) -> None:
    """A cancel scope cancels every await, the proxied __aexit__'s included; the
    exit must still run on the owner, as it would natively."""
    anyio = pytest.importorskip("anyio", reason="anyio comes with the test group")
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
