"""A blocking call returns the value, on every supported Python (issue 53, item 7).

asyncpg wraps each query method of a pooled connection in a plain function that
returns the method's coroutine, and marks the wrapper as a coroutine function
from Python 3.12 on; redis-py's commands are plain functions returning
coroutines.  With a ``returns`` rule such a member was a pending result, so
``blocking(conn).fetchval(...)`` gave a ``Blocking`` face to call ``.result()`` on
before 3.12 and the value from 3.12, and every redis command needed ``.result()``.
A member whose result is a coroutine now gives its value on the blocking face,
whatever the Python; one whose result is entered or iterated still gives a face.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import loopbridge as lb


class Connection:
    """asyncpg's connection, in miniature."""

    async def fetchval(self, query: str, *args: object) -> object:
        await asyncio.sleep(0)
        return (query, *args, asyncio.get_running_loop())


def _wrap(meth: Callable[..., Any], mark: bool) -> Callable[..., Any]:
    """A pooled connection's method as asyncpg makes it: a plain function that
    returns the connection method's coroutine (marked from 3.12 when ``mark``)."""

    @functools.wraps(meth)
    def call_con_method(self: Pooled, *args: object) -> Any:
        return meth(self._con, *args)

    if mark:
        inspect.markcoroutinefunction(call_con_method)  # type: ignore[attr-defined]
    return call_con_method


class Pooled:
    def __init__(self) -> None:
        self._con = Connection()


class Unmarked(Pooled):
    fetchval = _wrap(Connection.fetchval, mark=False)  # asyncpg before Python 3.12


MARKS = [False]
if hasattr(inspect, "markcoroutinefunction"):  # asyncpg's wrappers from Python 3.12

    class Marked(Pooled):
        fetchval = _wrap(Connection.fetchval, mark=True)

    MARKS.append(True)


class Commands:
    """redis-py's client, in miniature: commands are plain functions."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    async def execute_command(self, name: str, key: str) -> int:
        await asyncio.sleep(0)
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]

    def incr(self, key: str) -> Any:
        return self.execute_command("INCR", key)


class Acquiring:
    """What ``pool.acquire()`` gives: entered (or awaited), not a coroutine."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def __aenter__(self) -> str:
        self.pool.entered += 1
        return "connection"

    async def __aexit__(self, *exc: object) -> None:
        self.pool.released += 1

    def __await__(self) -> Any:
        return self.__aenter__().__await__()


class Pool:
    def __init__(self) -> None:
        self.made = self.entered = self.released = 0

    def acquire(self) -> Acquiring:
        self.made += 1
        return Acquiring(self)


def _adopted(owner: lb.LoopThread, make: Callable[[], Any], names: tuple[str, ...]) -> Any:
    async def on_owner() -> Any:
        return lb.adopt(make(), returns={n: lb.Owned() for n in names})

    return lb.proxy(owner.run(on_owner))


@pytest.mark.parametrize("marked", MARKS, ids=lambda m: "marked" if m else "unmarked")
def test_a_wrapped_query_gives_its_value(owner: lb.LoopThread, marked: bool) -> None:
    cls = Marked if marked else Unmarked
    conn = _adopted(owner, cls, ("fetchval",))
    value = lb.blocking(conn).fetchval("SELECT $1", 2)
    assert value == ("SELECT $1", 2, owner.loop)  # the value, run on the owner loop

    async def elsewhere() -> object:
        return await conn.fetchval("SELECT $1", 3)

    assert asyncio.run(elsewhere()) == ("SELECT $1", 3, owner.loop)


def test_a_command_gives_its_reply(owner: lb.LoopThread) -> None:
    client = _adopted(owner, Commands, ("incr",))
    redis = lb.blocking(client)
    assert [redis.incr("hits"), redis.incr("hits"), redis.incr("other")] == [1, 2, 1]
    assert lb.blocking(client, timeout=5).incr("hits") == 3


def test_an_entered_result_still_gives_a_face(owner: lb.LoopThread) -> None:
    """``with blocking(pool).acquire() as conn``: the face of what the call made.
    Once the member is seen to give something other than a coroutine, a call
    makes nothing until the face is first used (one crossing, as before)."""
    pool = _adopted(owner, Pool, ("acquire",))
    target: Pool = lb.unwrap(pool)
    b = lb.blocking(pool)
    with b.acquire() as conn:
        assert conn == "connection"
    assert (target.made, target.entered, target.released) == (1, 1, 1)
    face = b.acquire()
    assert isinstance(face, lb.Blocking) and target.made == 1  # not made yet
    with face as conn:
        assert conn == "connection"
    assert (target.made, target.entered, target.released) == (2, 2, 2)
    assert b.acquire().result() == "connection"  # awaited, on its face
