"""The run time keeps the promises the static types make.

The typing cases say that ``proxy(obj).m`` has the signature of ``obj.m`` and that
``blocking(p).m`` returns the awaited result or a ``BlockingStream``.  These tests
call the same model classes to check that the objects really have those shapes.
"""

from __future__ import annotations

import asyncio
import collections.abc
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from loopbridge import LoopAffinityError, LoopThread, adopt, blocking, proxy
from loopbridge._streams import BlockingStream


def _load_models(name: str = "_models") -> ModuleType:
    path = Path(__file__).parent / "cases" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"loopbridge_typing_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


models = _load_models()
MEMBERS = ("generate", "stream", "numbers", "kinds", "first", "get", "nothing")


@pytest.fixture(scope="module")
def owner() -> Any:
    with LoopThread(name="typing-owner") as thread:
        yield thread


def _make(owner: LoopThread, factory: Any, *args: Any) -> Any:
    async def build() -> Any:
        return factory(*args)  # constructed on the owner loop, which then owns it

    return owner.run(build)


def test_proxy_is_the_class_with_the_same_signatures(owner: LoopThread) -> None:
    engine = _make(owner, models.Engine)
    p = proxy(engine)
    assert isinstance(p, models.Engine)
    b = blocking(p)
    for name in MEMBERS:
        want = _own_signature(getattr(engine, name))
        # The members' own parameter lists, not the wrapped function's
        # (``inspect.signature`` would follow ``__wrapped__`` and hide a generic
        # ``(*args, **kwargs)`` rendering).
        assert _own_signature(getattr(p, name)) == want, name
        # The blocking face takes the same arguments (it returns the awaited
        # value, or a BlockingStream for an async generator).
        assert _own_signature(getattr(b, name)).parameters == want.parameters, name


def test_special_methods_keep_their_signatures(owner: LoopThread) -> None:
    dunders = _load_models("case_dunders")
    cases = [
        (dunders.Scorer, (), "__call__"),
        (dunders.Countdown, (2,), "__anext__"),
        (dunders.Session, (), "__aenter__"),
        (dunders.Session, (), "__aexit__"),
    ]
    for cls, args, name in cases:
        p = proxy(_make(owner, cls, *args))
        want = _own_signature(getattr(cls, name))
        # The proxy's own member (an inherited one would run off the owner).
        assert getattr(type(p), name) is not getattr(cls, name), name
        # Python looks special methods up on the type: that is what must be exact.
        got = _own_signature(getattr(type(p), name))
        assert got == want, f"{cls.__name__}.{name}: {got} != {want}"

    async def foreign() -> None:
        assert await proxy(_make(owner, dunders.Scorer))("abc", scale=2.0) == 6.0
        assert [n async for n in proxy(_make(owner, dunders.Countdown, 2))] == [1, 0]
        assert [w async for w in proxy(_make(owner, dunders.Words))] == ["a"]

    asyncio.run(foreign())


def _own_signature(member: Any) -> inspect.Signature:
    sig = inspect.signature(member, follow_wrapped=False)
    assert "__lb_args" not in sig.parameters, f"{member} is rendered with generic forwarding"
    return sig


def test_foreign_loop_gets_coroutines_and_async_generators(owner: LoopThread) -> None:
    p = proxy(_make(owner, models.Engine))

    async def foreign() -> None:
        call = p.generate("hello", max_tokens=2)
        assert isinstance(call, collections.abc.Coroutine)  # typed Coroutine[Any, Any, str]
        assert await call == "he"
        assert await p.kinds(1, "b", d=True) == (1, "b")
        assert await p.first(["x"]) == "x"
        assert await p.get(3) == 3 and await p.get("k") == "k"
        assert await p.nothing() is None

        stream = p.stream("x")  # typed AsyncIterator[Token]
        assert isinstance(stream, collections.abc.AsyncIterator)
        assert [type(t) async for t in stream] == [models.Token]

        gen = p.numbers(5, step=2)  # typed AsyncGenerator[int, None]
        assert isinstance(gen, collections.abc.AsyncGenerator)
        assert await gen.__anext__() == 0
        assert await gen.asend(None) == 2
        await gen.aclose()

    asyncio.run(foreign())


def test_blocking_face_returns_results_and_blocking_streams(owner: LoopThread) -> None:
    b = blocking(proxy(_make(owner, models.Engine)))
    assert b.generate("hello", max_tokens=2) == "he"  # typed str under the plugin
    assert b.nothing() is None
    stream = b.numbers(5)  # typed BlockingStream[int] under the plugin
    assert isinstance(stream, BlockingStream)
    assert isinstance(stream, collections.abc.Iterator)
    with stream as s:
        assert list(s) == [0, 1, 2, 3, 4]
    tokens = b.stream("x")
    assert [type(t) for t in tokens] == [models.Token]
    tokens.close()


def test_declared_members_and_adopted_foreign_class(owner: LoopThread) -> None:
    store = proxy(_make(owner, models.Store, "s"))
    assert store.name == "s" and store.config == {}  # declared stable: typed and readable

    foreign = _make(owner, models.Foreign)
    adopt(foreign, loop=owner.loop, stable=("limit",))
    f = proxy(foreign)
    assert isinstance(f, models.Foreign)
    assert _own_signature(f.fetch) == inspect.signature(foreign.fetch, follow_wrapped=False)
    assert f.limit == 3
    assert blocking(f).fetch("u", timeout=1.0) == b"u"
    with blocking(f).lines("a", "b") as lines:
        assert list(lines) == ["a", "b"]


def test_what_the_types_do_not_say(owner: LoopThread) -> None:
    """A documented gap: this type-checks but is refused at run time."""
    p = proxy(_make(owner, models.Engine))
    with pytest.raises(LoopAffinityError):
        p.sync_member()  # typed `() -> int`, but undeclared sync members are refused
