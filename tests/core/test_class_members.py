"""Classmethods and staticmethods through a proxy behave as on the class (issue 53, item 5).

A sync classmethod got the proxy class as ``cls``: ``p.from_config(...)`` then
built a proxy class instance, whose ``__init__`` refuses ("create proxies with
loopbridge.proxy(obj)").  It is bound to the object's own class now, through the
proxy, its class and its blocking face alike.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

import loopbridge as lb


@lb.loop_affine
class Engine:
    def __init__(self, size: int = 1) -> None:
        self.size = size

    @classmethod
    def from_config(cls, size: int, *, tag: str = "t") -> tuple[type, int, str]:
        """Build the arguments from a config."""
        return cls, size, tag

    @classmethod
    def create(cls, size: int) -> Engine:
        return cls(size)

    @staticmethod
    def version(major: int = 1) -> str:
        return f"v{major}"

    @classmethod
    async def acreate(cls, size: int) -> tuple[type, asyncio.AbstractEventLoop]:
        return cls, asyncio.get_running_loop()


class Subclass(Engine):
    pass


@pytest.fixture
def engine(owner: lb.LoopThread) -> Engine:
    async def make() -> Engine:
        return Engine()

    return owner.run(make)


def test_a_sync_classmethod_gets_the_objects_class(engine: Engine) -> None:
    p = lb.proxy(engine)
    assert p.from_config(3) == (Engine, 3, "t")
    assert p.from_config(4, tag="x") == (Engine, 4, "x")
    assert type(p).from_config(5) == (Engine, 5, "t")
    assert lb.blocking(p).from_config(6) == (Engine, 6, "t")


def test_a_classmethod_constructor_builds_the_objects_class(engine: Engine) -> None:
    """The case that raised "create proxies with loopbridge.proxy(obj)"."""
    made = lb.proxy(engine).create(7)
    assert type(made) is Engine and made.size == 7 and not lb.is_proxy(made)


def test_a_subclass_proxy_binds_the_subclass(owner: lb.LoopThread) -> None:
    async def make() -> Subclass:
        return Subclass()

    p = lb.proxy(owner.run(make))
    assert p.from_config(1)[0] is Subclass
    assert type(p.create(2)) is Subclass


def test_they_look_as_on_the_class(engine: Engine) -> None:
    p = lb.proxy(engine)
    bound = p.from_config
    assert inspect.ismethod(bound) and bound.__self__ is Engine
    assert bound.__doc__ == Engine.from_config.__doc__
    assert inspect.signature(bound) == inspect.signature(engine.from_config)
    assert p.version() == "v1" and p.version(2) == "v2"
    assert inspect.signature(p.version) == inspect.signature(engine.version)


def test_an_async_classmethod_runs_on_the_owner_with_the_objects_class(
    owner: lb.LoopThread, engine: Engine
) -> None:
    p = lb.proxy(engine)

    async def elsewhere() -> tuple[type, asyncio.AbstractEventLoop]:
        return await p.acreate(1)

    cls, loop = asyncio.run(elsewhere())
    assert cls is Engine and loop is owner.loop
    assert inspect.signature(p.acreate) == inspect.signature(engine.acreate)
