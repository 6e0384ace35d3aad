"""What frameworks see of a proxy's members (issue 53, item 4).

FastAPI and Starlette, ``unittest.mock.create_autospec``, pytest-asyncio and Ray
branch on ``inspect.iscoroutinefunction``, ``asyncio.iscoroutinefunction`` and
``inspect.isasyncgenfunction``: each must say of a proxy's member what it says of
the object's own, on every supported Python, and the member must still behave as
a proxy member (marshalled off the owner loop, the object's own on it).
"""

from __future__ import annotations

import asyncio
import inspect
import unittest.mock
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import loopbridge as lb


@lb.loop_affine(
    threadsafe=("size",),
    returns={"child": lb.Owned(), "children": lb.Owned(), "opened": lb.Owned()},
)
class Model:
    def __init__(self) -> None:
        self.n = 0

    async def generate(self, prompt: str, *, n: int = 1) -> str:
        return prompt * n

    async def stream(self, n: int = 2) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async def child(self) -> Model:
        return type(self)()

    async def children(self, n: int) -> AsyncIterator[Model]:
        for _ in range(n):
            yield type(self)()

    def opened(self) -> Any:  # a sync member with a rule: a pending result
        return asyncio.sleep(0, "opened")

    def size(self) -> int:  # a sync member, declared thread-safe
        return self.n

    @classmethod
    async def acreate(cls) -> str:
        return cls.__name__

    @staticmethod
    async def aversion() -> int:
        return 3

    @classmethod
    async def agen(cls) -> AsyncIterator[str]:
        yield cls.__name__


@pytest.fixture
def model(owner: lb.LoopThread) -> Model:
    async def make() -> Model:
        return Model()

    return owner.run(make)


COROUTINES = ("generate", "child", "acreate", "aversion")
GENERATORS = ("stream", "children", "agen")
DETECTORS: list[Callable[[object], bool]] = [inspect.iscoroutinefunction]
# asyncio.iscoroutinefunction is deprecated from 3.14; it answers as on the object.
DETECTORS.append(asyncio.iscoroutinefunction)


@pytest.mark.parametrize("name", COROUTINES)
@pytest.mark.parametrize("detect", DETECTORS, ids=lambda f: f"{f.__module__}")
def test_async_members_are_coroutine_functions(
    model: Model, name: str, detect: Callable[[object], bool]
) -> None:
    p = lb.proxy(model)
    assert detect(getattr(model, name)) is True
    assert detect(getattr(p, name)) is True  # bound, as a framework gets it
    assert detect(getattr(type(p), name)) is True  # on the class (Ray reads the class)
    assert not inspect.isasyncgenfunction(getattr(p, name))


@pytest.mark.parametrize("name", GENERATORS)
def test_async_generator_members_are_async_generator_functions(model: Model, name: str) -> None:
    p = lb.proxy(model)
    assert inspect.isasyncgenfunction(getattr(model, name)) is True
    assert inspect.isasyncgenfunction(getattr(p, name)) is True
    assert inspect.isasyncgenfunction(getattr(type(p), name)) is True
    assert not inspect.iscoroutinefunction(getattr(p, name))
    assert not asyncio.iscoroutinefunction(getattr(p, name))


@pytest.mark.parametrize("name", ["opened", "size", "__await__", "__aiter__"])
def test_sync_members_stay_sync(model: Model, name: str) -> None:
    p = lb.proxy(model)
    member = getattr(type(p), name, None)
    if member is None:
        return  # the object has none: nor does the proxy
    assert not inspect.iscoroutinefunction(member)
    assert not asyncio.iscoroutinefunction(member)
    assert not inspect.isasyncgenfunction(member)


def test_signatures_and_names_are_the_objects(model: Model) -> None:
    p = lb.proxy(model)
    for name in (*COROUTINES, *GENERATORS):
        member = getattr(p, name)
        assert inspect.signature(member) == inspect.signature(getattr(model, name)), name
        assert member.__name__ == name
        assert member.__qualname__ == getattr(Model, name).__qualname__
    assert p.stream.__doc__ == Model.stream.__doc__


def _starlette_like_is_async(obj: object) -> bool:
    """How an ASGI framework decides to await an endpoint or call it in a thread pool."""
    while isinstance(obj, __import__("functools").partial):
        obj = obj.func
    call = getattr(obj, "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(call)


def test_a_framework_awaits_them_and_gets_the_result(model: Model) -> None:
    """Detected as async, the member is awaited on the framework's loop, not run in a
    thread pool whose result would be a coroutine nobody awaits."""
    p = lb.proxy(model)
    endpoint = p.generate
    assert _starlette_like_is_async(endpoint)

    async def serve() -> tuple[Any, ...]:
        body = await endpoint("ab", n=2)
        items = [i async for i in p.stream(3)]
        child = await p.child()
        return body, items, lb.is_proxy(child), await p.acreate(), await p.aversion()

    assert asyncio.run(serve()) == ("abab", [0, 1, 2], True, "Model", 3)


def test_create_autospec_makes_async_mocks(model: Model) -> None:
    mock = unittest.mock.create_autospec(lb.proxy(model), instance=True)
    like = unittest.mock.create_autospec(model, instance=True)
    for name in COROUTINES:
        assert isinstance(getattr(mock, name), unittest.mock.AsyncMock), name
    for name in (*COROUTINES, *GENERATORS, "size"):
        is_async = isinstance(getattr(like, name), unittest.mock.AsyncMock)
        assert isinstance(getattr(mock, name), unittest.mock.AsyncMock) is is_async, name

    mock.generate.return_value = "mocked"

    async def use() -> object:
        return await mock.generate("x")

    assert asyncio.run(use()) == "mocked"
    mock.generate.assert_awaited_once_with("x")


def test_stream_members_still_give_streams(owner: lb.LoopThread, model: Model) -> None:
    """Flagged as async generator functions, the members give what they gave:
    off the owner loop a stream that read_ahead() sets up, on it the object's
    own generator."""
    p = lb.proxy(model)

    async def elsewhere() -> list[int]:
        stream = lb.read_ahead(p.stream(3), 0)
        return [i async for i in stream]

    assert asyncio.run(elsewhere()) == [0, 1, 2]

    async def on_owner() -> bool:
        return inspect.isasyncgen(p.stream()) and inspect.isasyncgen(p.agen())

    assert owner.run(on_owner) is True
    assert list(lb.blocking(p).stream(2)) == [0, 1]
    assert list(lb.blocking(p).agen()) == ["Model"]


def test_owner_loop_calls_go_straight_through(owner: lb.LoopThread, model: Model) -> None:
    p = lb.proxy(model)

    async def on_owner() -> tuple[str, list[int]]:
        return await p.generate("z"), [i async for i in p.stream(2)]

    assert owner.run(on_owner) == ("z", [0, 1])
