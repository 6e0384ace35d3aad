"""Wrappers with a method's own signature (:mod:`loopbridge._codegen`): the hot path
has one definition, rendered two ways; both renderings behave alike.

A proxy member and the affinity check are generated from one template each,
either with the method's own signature or, when that can't be mirrored, with
plain ``(*args, **kwargs)`` forwarding.  Each test of the renderings runs both; a
member a decorator wraps keeps the signature its wrapper really has.
"""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import _affinity, _codegen, _compat, _faces, _ownership
from loopbridge._codegen import GENERIC

from .conftest import Adder

RENDERINGS = ["mirrored", "generic"]


def _member(rendering: str) -> Any:
    fn = _affinity.original(Adder.__dict__["add"])
    return _faces._async_member("add", fn, generic=rendering == "generic")


def _is_generic(member: Any) -> bool:
    # Before 3.12 an async member is a FunctionLikeMember, whose __code__ is the
    # method's: the generated function is its class's __call__.
    fn = member if isinstance(member, types.FunctionType) else type(member).__call__
    return GENERIC.self_name in fn.__code__.co_varnames


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_proxy_member_renderings_route_alike(owner: lb.LoopThread, rendering: str) -> None:
    member = _member(rendering)
    assert _is_generic(member) is (rendering == "generic")

    async def make() -> Adder:
        return Adder()

    adder = owner.run(make)
    p = lb.proxy(adder)

    async def same_loop() -> tuple[int, bool]:
        coro = member(p, 1, 2, 3, scale=2, x=4)
        # Straight through on the owner loop: the member's own coroutine.
        return await coro, coro.cr_code is _affinity.original(Adder.add).__code__

    assert owner.run(same_loop) == (20, True)

    async def other_loop() -> int:
        return int(await member(p, 1, 2, 3, scale=2, x=4))

    assert asyncio.run(other_loop()) == 20

    # Made before any loop runs: decided when awaited.
    deferred = member(p, 5)

    async def await_it() -> int:
        return int(await deferred)

    assert asyncio.run(await_it()) == 6


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_affinity_check_renderings_alike(asyncio_owner: lb.LoopThread, rendering: str) -> None:
    fn = _affinity.original(Adder.__dict__["add"])
    guarded = _codegen.build(
        _affinity._GUARD_CORO,
        fn,
        "check",
        generic=rendering == "generic",
        __lb_fn=fn,
        __lb_check=_affinity._check,
        __lb_ident=threading.get_ident,
        __lb_grl=_compat.get_running_loop,
        __lb_key=_ownership._ATTR,
    )
    assert _is_generic(guarded) is (rendering == "generic")

    async def make() -> Adder:
        return Adder()

    adder = asyncio_owner.run(make)

    async def on_owner() -> int:
        return int(await guarded(adder, 1, 2))

    assert asyncio_owner.run(on_owner) == 3

    async def elsewhere() -> None:
        with pytest.raises(lb.LoopAffinityError, match="belongs to"):
            await guarded(adder, 1, 2)

    asyncio.run(elsewhere())


def test_members_wrapped_by_decorators_keep_their_real_signature(
    asyncio_owner: lb.LoopThread,
) -> None:
    import functools

    def injects_retries(fn: Any) -> Any:
        @functools.wraps(fn)
        async def wrapper(self: Any, *args: Any, retries: int = 0, **kwargs: Any) -> Any:
            return (await fn(self, *args, **kwargs), retries)

        return wrapper

    @lb.loop_affine
    class Decorated:
        @injects_retries
        async def get(self, x: int) -> int:
            return x

    async def make() -> Decorated:
        return Decorated()

    p = lb.proxy(asyncio_owner.run(make))

    async def main() -> None:
        assert await p.get(1) == (1, 0)
        assert await p.get(2, retries=3) == (2, 3)  # accepted by the real wrapper

    asyncio.run(main())
