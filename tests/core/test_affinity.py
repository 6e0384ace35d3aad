"""The always-on affinity check (:mod:`loopbridge._affinity`): it runs where the
coroutine runs, undecorated subclasses inherit it, its error tells the two loops
apart, and its policy can warn or switch it off.

On 3e67832 the check ran where the coroutine was *made*, so the three most
common naive misuses ran the object on a foreign loop with no error:
``asyncio.run(obj.m())`` from a plain thread, direct use under trio, and
``asyncio.run_coroutine_threadsafe(obj.m(), other_loop)`` for a coroutine made
on the owner.  Async methods added or overridden in an undecorated subclass of a
``@loop_affine`` class were not guarded at all.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import trio

import loopbridge as lb

from .conftest import Engine, Service


@lb.loop_affine
class Base:
    def __init__(self) -> None:
        self.ran_on: list[asyncio.AbstractEventLoop | None] = []

    async def m(self) -> str:
        try:
            self.ran_on.append(asyncio.get_running_loop())
        except RuntimeError:
            self.ran_on.append(None)
        return "m"


class Sub(Base):  # not decorated: declarations and the check are inherited
    def __init__(self) -> None:  # does not call super().__init__()
        self.ran_on = []

    async def m(self) -> str:  # overridden
        self.ran_on.append(asyncio.get_running_loop())
        return "sub m"

    async def added(self) -> str:
        self.ran_on.append(asyncio.get_running_loop())
        return "added"


@pytest.fixture(params=[Base, Sub])
def obj(request: pytest.FixtureRequest, owner: lb.LoopThread) -> Any:
    async def make() -> Any:
        return request.param()

    return owner.run(make)


def test_asyncio_run_from_a_plain_thread_is_refused(obj: Any) -> None:
    with pytest.raises(lb.LoopAffinityError, match=r"m\(\) called from"):
        asyncio.run(obj.m())
    assert obj.ran_on == []


def test_direct_use_under_trio_is_refused(obj: Any) -> None:
    async def main() -> None:
        await obj.m()

    with pytest.raises(lb.LoopAffinityError, match="no asyncio loop"):
        trio.run(main)
    assert obj.ran_on == []


def test_a_coroutine_made_on_the_owner_and_run_elsewhere_is_refused(
    owner: lb.LoopThread, obj: Any
) -> None:
    other = lb.LoopThread(name="other").start()
    try:

        async def send() -> Any:
            return asyncio.run_coroutine_threadsafe(obj.m(), other.loop)

        fut = owner.run(send)
        with pytest.raises(lb.LoopAffinityError, match=r"called from .* on thread 'other'"):
            fut.result(30)
    finally:
        other.stop()
    assert obj.ran_on == []


def test_a_coroutine_made_anywhere_and_run_on_the_owner_runs(
    owner: lb.LoopThread, obj: Any
) -> None:
    coro = obj.m()  # made on this plain thread, run on the owner: fine
    assert asyncio.run_coroutine_threadsafe(coro, owner.loop).result(30).endswith("m")
    assert obj.ran_on == [owner.loop]


def test_an_undecorated_subclass_is_guarded_and_owned(owner: lb.LoopThread) -> None:
    async def make() -> Sub:
        return Sub()

    sub = owner.run(make)
    assert lb.owner_loop(sub) is owner.loop  # its own __init__ did not call super()'s

    async def elsewhere() -> str:
        for call in (sub.m, sub.added):
            with pytest.raises(lb.LoopAffinityError, match="proxy"):
                await call()
        return await lb.proxy(sub).added()

    assert asyncio.run(elsewhere()) == "added"
    assert sub.ran_on == [owner.loop]


def test_the_owner_path_still_runs_directly(owner: lb.LoopThread, obj: Any) -> None:
    async def on_owner() -> str:
        return await obj.m()  # type: ignore[no-any-return]

    assert owner.run(on_owner).endswith("m")
    done = threading.Event()

    async def transferred() -> str:
        lb.transfer(obj)  # the check follows a transfer
        done.set()
        return await obj.m()  # type: ignore[no-any-return]

    assert asyncio.run(transferred()).endswith("m") and done.is_set()


def _make_outer_class() -> Any:
    secret = "closure"

    @lb.loop_affine
    class Rich(Base):
        async def m(self, a: int = 1, *rest: int, k: str = "k", **kw: Any) -> Any:
            """Its own doc."""
            base = await super().m()  # zero-argument super(): the __class__ cell
            self.__private = a  # name mangling, as in the class itself
            return base, a, rest, k, kw, secret, self.__private

    return Rich


def test_the_check_is_compiled_into_the_coroutine_function(owner: lb.LoopThread) -> None:
    """No wrapper and no extra frame: the function's own body, with the check in
    front; defaults, keyword defaults, closures, super() and mangling all hold."""
    from loopbridge import _affinity

    rich = _make_outer_class()
    fn = rich.__dict__["m"]
    assert _affinity.original(fn) is not fn and "_loopbridge_check" in fn.__code__.co_freevars
    assert fn.__doc__ == "Its own doc." and fn.__qualname__.endswith("Rich.m")
    # Module-level classes too, whose methods call through an imported module
    # (compiled differently for an import-bound name since 3.12).
    for member in (Base.__dict__["m"], Feed.__dict__["items"]):
        assert "_loopbridge_check" in member.__code__.co_freevars

    async def on_owner() -> Any:
        return await rich().m(2, 3, k="x", z=1)

    assert owner.run(on_owner) == ("m", 2, (3,), "x", {"z": 1}, "closure", 2)
    obj = owner.run(_factory(rich))
    with pytest.raises(lb.LoopAffinityError, match=r"m\(\) called from"):
        asyncio.run(obj.m())


def _factory(cls: Any) -> Any:
    async def make() -> Any:
        return cls()

    return make


def test_without_source_the_check_is_a_wrapper(owner: lb.LoopThread) -> None:
    ns: dict[str, Any] = {}
    exec("async def m(self):\n    return 'made by exec'\n", ns)  # no source to read
    cls = lb.loop_affine(type("Execd", (), {"m": ns["m"]}))
    assert "_loopbridge_check" not in cls.__dict__["m"].__code__.co_freevars
    obj = owner.run(_factory(cls))
    with pytest.raises(lb.LoopAffinityError, match="proxy"):
        asyncio.run(obj.m())

    async def on_owner() -> str:
        return await obj.m()  # type: ignore[no-any-return]

    assert owner.run(on_owner) == "made by exec"


@lb.loop_affine
class Feed:
    def __init__(self) -> None:
        self.stepped = 0

    async def items(self) -> Any:
        self.stepped += 1
        yield 1


async def _first(agen: Any) -> Any:
    async for item in agen:
        return item
    return None


def test_an_async_generator_is_checked_at_its_first_step(owner: lb.LoopThread) -> None:
    """Made on a plain thread (or on the owner), iterated on a foreign loop or under
    trio: refused at the first step, before its body runs."""
    feed = owner.run(_factory(Feed))
    with pytest.raises(lb.LoopAffinityError, match=r"items\(\) called from"):
        asyncio.run(_first(feed.items()))

    async def under_trio() -> None:
        await _first(feed.items())

    with pytest.raises(lb.LoopAffinityError, match="no asyncio loop"):
        trio.run(under_trio)

    async def made_on_owner() -> Any:
        return feed.items()

    agen = owner.run(made_on_owner)
    with pytest.raises(lb.LoopAffinityError, match="called from"):
        asyncio.run(_first(agen))
    assert feed.stepped == 0
    assert asyncio.run_coroutine_threadsafe(_first(feed.items()), owner.loop).result(30) == 1
    assert feed.stepped == 1


# ------------------------------------------ direct calls off the owner, and the policy
def test_direct_cross_loop_call_is_caught(owner: lb.LoopThread, engine: Engine) -> None:
    async def main() -> None:
        with pytest.raises(lb.LoopAffinityError, match="proxy"):
            await engine.echo(1)

    asyncio.run(main())


def test_affinity_check_policy(owner: lb.LoopThread, engine: Engine) -> None:
    async def main() -> None:
        old = lb.set_affinity_check("warn")
        try:
            with pytest.warns(RuntimeWarning, match="proxy"):
                assert await engine.echo(1) == 1  # warned at its first step, then run here
            lb.set_affinity_check("off")
            assert await engine.echo(2) == 2  # no check at all
        finally:
            lb.set_affinity_check(old)
        with pytest.raises(ValueError):
            lb.set_affinity_check("sometimes")

    asyncio.run(main())


# Issue 33, point 10: on 3e67832 the error printed two identical loop reprs.
def test_the_affinity_error_tells_the_two_loops_apart(
    owner: lb.LoopThread, service: Service
) -> None:
    async def main() -> str:
        with pytest.raises(lb.LoopAffinityError) as info:
            await service.get()
        return str(info.value)

    msg = asyncio.run(main())
    assert f"on thread {threading.current_thread().name!r} (id {threading.get_ident()})" in msg
    assert f"on thread {owner.name!r}" in msg
    assert f"0x{id(owner.loop):x}" in msg
