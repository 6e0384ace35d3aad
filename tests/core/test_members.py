"""Member kinds (:mod:`loopbridge._members`): a sync member is refused through a
proxy, and the advice a refusal gives must not cause the bug it guards against.

On 3e67832 a refused sync member's message always suggested ``stable=`` or
``threadsafe=``.  For a member that returns an awaitable or an async context
manager (aiosqlite's ``execute``, an ``@asynccontextmanager``, async methods
made in ``__getattr__``) following that advice runs the member, and its result,
on the caller's loop.  The right fix is ``returns=``, and following it works.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any

import pytest

import loopbridge as lb

from .conftest import Engine


def test_sync_members_are_refused_with_a_clear_error(engine: Engine) -> None:
    p = lb.proxy(engine)
    with pytest.raises(lb.LoopAffinityError, match=r"^Engine\.bump\(\) is refused .*threadsafe="):
        p.bump()
    with pytest.raises(lb.LoopAffinityError, match="'log'"):
        _ = p.log  # instance attribute, not declared
    with pytest.raises(lb.LoopAffinityError, match=r"^Engine\.name cannot be set"):
        p.name = "other"
    with pytest.raises(AttributeError):
        _ = p.no_such_member
    assert engine.counter == 0


# ------------------------------------------------------ what a refusal advises
class Result:
    """aiosqlite's shape: awaitable and an async context manager."""

    def __init__(self, coro: Awaitable[Any]) -> None:
        self._coro = coro

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()

    async def __aenter__(self) -> Any:
        return await self._coro

    async def __aexit__(self, *exc: object) -> None:
        pass


def result_of(method: Callable[..., Awaitable[Any]]) -> Callable[..., Result]:
    """aiosqlite's ``@contextmanager``: a sync wrapper around an async method."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Result:
        return Result(method(*args, **kwargs))

    return wrapper


class Connection:
    def __init__(self) -> None:
        self.rows = [1, 2]

    @result_of
    async def execute(self, sql: str) -> tuple[str, asyncio.AbstractEventLoop]:
        return sql, asyncio.get_running_loop()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncio.AbstractEventLoop]:
        yield asyncio.get_running_loop()

    def cursor(self) -> Awaitable[int]:  # annotated: its result is an awaitable
        return asyncio.sleep(0, 1)

    def size(self) -> int:  # a plain sync member
        return len(self.rows)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("fetch_"):

            async def fetch() -> tuple[str, asyncio.AbstractEventLoop]:
                return name, asyncio.get_running_loop()

            return fetch
        raise AttributeError(name)


def _adopted(owner: lb.LoopThread, **declared: Any) -> Connection:
    async def make() -> Connection:
        return lb.adopt(Connection(), **declared)

    return owner.run(make)


@pytest.mark.parametrize(
    "member, why",
    [
        ("execute", "wraps the async function"),
        ("transaction", "wraps the async function"),
        ("cursor", "annotated to return"),
    ],
)
def test_a_loop_bound_result_is_advised_returns_only(
    owner: lb.LoopThread, member: str, why: str
) -> None:
    p = lb.proxy(_adopted(owner))
    with pytest.raises(lb.LoopAffinityError) as info:
        getattr(p, member)
    msg = str(info.value)
    assert why in msg
    assert f"returns={{{member!r}: loopbridge.Owned()}}" in msg
    assert f"stable=({member!r},)" not in msg and f"threadsafe=({member!r},)" not in msg


def test_a_member_made_by_getattr_is_advised_returns_first(owner: lb.LoopThread) -> None:
    p = lb.proxy(_adopted(owner))
    with pytest.raises(lb.LoopAffinityError) as info:
        p.fetch_rows  # noqa: B018
    msg = str(info.value)
    assert "made by Connection.__getattr__" in msg
    assert msg.index("returns={'fetch_rows'") < msg.index("threadsafe=('fetch_rows',)")


def test_a_plain_sync_member_still_gets_stable_and_threadsafe(owner: lb.LoopThread) -> None:
    p = lb.proxy(_adopted(owner))
    with pytest.raises(lb.LoopAffinityError, match=r"^Connection\.size\(\) is refused") as info:
        p.size()
    # annotated to give an int: threadsafe= is the advice, not returns= or stable=
    assert "`threadsafe=('size',)`" in str(info.value).split(". ")[0]
    assert "returns=" not in str(info.value) and "stable=" not in str(info.value)


def test_following_the_advice_runs_them_on_the_owner(owner: lb.LoopThread) -> None:
    rule = lb.Owned()
    conn = _adopted(
        owner,
        returns={"execute": rule, "transaction": rule, "cursor": rule, "fetch_rows": rule},
    )
    p = lb.proxy(conn)

    async def main() -> None:
        sql, ran_on = await p.execute("select 1")
        assert (sql, ran_on) == ("select 1", owner.loop)
        async with p.execute("select 2") as (_, ran_on):
            assert ran_on is owner.loop
        async with p.transaction() as ran_on:
            assert ran_on is owner.loop
        assert await p.cursor() == 1
        assert await p.fetch_rows() == ("fetch_rows", owner.loop)

    asyncio.run(main())
    b = lb.blocking(p)
    assert b.fetch_rows().result() == ("fetch_rows", owner.loop)
    assert b.execute("select 3").result() == ("select 3", owner.loop)
