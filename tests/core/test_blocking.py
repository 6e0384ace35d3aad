"""The blocking face for plain threads (:mod:`loopbridge._blocking`): calls and
iterators that block the calling thread only, bounded by the face's timeout."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

import loopbridge as lb

from .conftest import Engine, Service


def test_blocking_calls_and_iterators(owner: lb.LoopThread, engine: Engine) -> None:
    b = lb.blocking(lb.proxy(engine))
    assert b.echo(5) == 5
    assert b.where() is owner.loop
    assert list(b.count(100)) == list(range(100))
    assert b.name == "engine"
    with pytest.raises(ValueError, match="bad"):
        b.fail("bad")
    with pytest.raises(lb.LoopAffinityError):
        b.bump()


def test_blocking_from_many_threads(owner: lb.LoopThread, engine: Engine) -> None:
    b = lb.blocking(engine)  # a raw loop-affine object works too

    def work(k: int) -> int:
        return sum(b.echo(i) for i in range(200)) + sum(b.count(50)) * 0 + k

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(16)))
    assert results == [sum(range(200)) + k for k in range(16)]


def test_blocking_iterator_close_runs_owner_finally(owner: lb.LoopThread, engine: Engine) -> None:
    b = lb.blocking(lb.proxy(engine))
    with b.count(10**9, delay=0.001) as it:
        assert next(it) == 0
        assert next(it) == 1
    assert ("finally", owner.loop) in engine.log


def test_blocking_on_the_owner_thread_raises_instead_of_deadlocking(
    owner: lb.LoopThread, engine: Engine
) -> None:
    b = lb.blocking(lb.proxy(engine))

    async def on_owner() -> str:
        with pytest.raises(lb.LoopAffinityError, match="deadlock"):
            b.echo(1)
        with pytest.raises(lb.LoopAffinityError, match="deadlock"):
            next(iter(b.count(3)))
        return "ok"

    assert owner.run(on_owner) == "ok"


def test_blocking_from_a_foreign_loop_thread_works(owner: lb.LoopThread, engine: Engine) -> None:
    # Blocks that (foreign) loop's thread only; no deadlock.
    b = lb.blocking(engine)

    async def main() -> int:
        return b.echo(7)  # type: ignore[no-any-return]

    assert asyncio.run(main()) == 7


def test_a_subclass_of_the_proxy_class_keeps_the_blocking_members(
    owner: lb.LoopThread, engine: Engine
) -> None:
    # An adapter's layer over a proxy class (SGLang's wraps the request-taking
    # members for its server): the blocking face still crosses, it never hands a
    # plain thread the async member's coroutine.
    p = lb.proxy(engine)
    base = type(p)
    seen: list[int] = []

    async def echo(self: Engine, value: int) -> int:  # the layer's own async face
        seen.append(value)
        return await base.echo(self, value)  # type: ignore[no-any-return]

    layered = type(base)(base.__name__, (base,), {"__slots__": (), "echo": echo})
    object.__setattr__(p, "__class__", layered)
    b = lb.blocking(p)
    assert b.echo(7) == 7 and b.where() is owner.loop
    assert list(b.count(3)) == [0, 1, 2]
    assert seen == []  # the face ran what the proxy class marshals


# ------------------------------------------------------ blocking waits are bounded
# On 3e67832 ``blocking()`` had no timeout: a wait that could never end hung for ever.
def test_a_blocking_call_gives_up_after_its_timeout(owner: lb.LoopThread, engine: Engine) -> None:
    b = lb.blocking(lb.proxy(engine), timeout=0.2)
    with pytest.raises(TimeoutError, match=r"Engine\.sleep\(\).*0\.2 s"):
        b.sleep(30)
    assert engine.log[0][0] == "cancelled"  # the owner side was cancelled and cleaned up
    assert engine.log[1][0] == "cleanup done"
    assert b.echo(3) == 3  # a face with a timeout still answers what is quick


def test_a_blocking_stream_gives_up_per_item(owner: lb.LoopThread, engine: Engine) -> None:
    items = lb.blocking(lb.proxy(engine), timeout=0.2).count(3, 30.0)
    with pytest.raises(TimeoutError, match=r"Engine\.count\(\)"):
        next(items)
    assert engine.count_finished.wait(30)  # closed on the owner


def test_timeout_values_are_checked(engine: Engine) -> None:
    with pytest.raises(ValueError, match="positive"):
        lb.blocking(lb.proxy(engine), timeout=0)
    b = lb.blocking(lb.proxy(engine))
    assert lb.blocking(b) is b
    assert lb.blocking(b, timeout=1.0) is not b  # the same proxy, with a timeout


# Issue 33, point 10: on 3e67832 this said "decorate its class with @loop_affine".
def test_blocking_of_a_blocking_face_is_that_face(service: Service) -> None:
    b = lb.blocking(lb.proxy(service))
    assert lb.blocking(b) is b
    assert lb.blocking(b).get() == 1
