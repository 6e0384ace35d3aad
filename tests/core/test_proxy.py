"""The awaitable face (:mod:`loopbridge._proxy`): a proxy is an instance of the
object's own class, made only for loop-affine objects, and tells itself apart from
the object it stands for; a loop-affine result comes back as a proxy.
"""

from __future__ import annotations

import asyncio

import pytest

import loopbridge as lb

from .conftest import Engine


def test_proxy_is_an_instance_of_the_real_class(engine: Engine) -> None:
    p = lb.proxy(engine)
    assert isinstance(p, Engine)
    assert lb.proxy(p) is p
    assert p.name == "engine"  # stable
    assert p.describe() == "engine engine"  # thread-safe


def test_not_loop_affine_is_a_typed_error() -> None:
    class Plain:
        async def go(self) -> None: ...

    with pytest.raises(lb.LoopAffinityError, match="adopt"):
        lb.proxy(Plain())


def test_is_proxy_and_unwrap(engine: Engine) -> None:
    p = lb.proxy(engine)
    assert lb.is_proxy(p) and not lb.is_proxy(engine)
    assert lb.unwrap(p) is engine
    assert lb.unwrap(engine) is engine


@lb.loop_affine(stable=("name",))
class Child:
    def __init__(self, name: str) -> None:
        self.name = name

    async def where(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


@lb.loop_affine
class Parent:
    async def child(self) -> Child:
        return Child("c")


def test_loop_affine_result_comes_back_as_a_proxy(owner: lb.LoopThread) -> None:
    async def make() -> Parent:
        return Parent()

    p = lb.proxy(owner.run(make))
    child = lb.blocking(p).child()
    assert lb.is_proxy(child) and child.name == "c"
    assert lb.blocking(child).where() is owner.loop
