"""The asyncpg recipe (docs/recipes.md) against a real PostgreSQL server.

First the raw pool shared between its owner loop and another loop, failing as
asyncpg's users report it; then the same calls through loopbridge, from plain
threads and from asyncio, uvloop and trio callers, cancellation included, with the
server's connection count checked after each.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from recipes.recipe import load_recipe

from loopbridge import LoopThread, blocking, is_proxy, unwrap

from .conftest import advisory_lock, pg_backends, pg_lock_waiters, settle
from .crossing import (
    CALLERS,
    OwnerHeld,
    cancel_params,
    cancelled_midway,
    on_other_loop,
    run_caller,
)
from .launch import Postgres

# The recipe runs with the affinity sanitizer raising: a client used off its owner
# loop anywhere in it, its streaming paths included, fails the test.
pytestmark = pytest.mark.loopbridge_sanitize("raise")

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed (group: recipes)")
recipe = load_recipe("asyncpg")


async def _pool(pg: Postgres, size: int) -> Any:
    return await asyncpg.create_pool(pg.dsn, min_size=size, max_size=size)


@pytest.mark.loopbridge_sanitize("off")  # shows the race itself, unreported
def test_raw_connection_shared_with_another_loop_fails(pg: Postgres) -> None:
    """A connection from the owner's pool, used by another loop: both sides break.

    The other loop's query is sent, then its task awaits a future of the owner's
    loop: "got Future attached to a different loop". The owner's next query on the
    same connection finds the protocol still busy with the orphaned one: "another
    operation is in progress". The owner is held between the two, so its loop
    cannot read the orphaned reply first.
    """
    with LoopThread() as owner:
        pool = owner.run(_pool, pg, 1)
        conn = owner.run(pool.acquire)
        held = OwnerHeld(owner.loop, then=lambda: conn.fetchval("SELECT 2"))
        other = on_other_loop(lambda: conn.fetchval("SELECT 1"))
        on_owner = held.release()

        assert isinstance(other, RuntimeError)
        assert "attached to a different loop" in str(other)
        assert isinstance(on_owner, asyncpg.InterfaceError)
        assert "another operation is in progress" in str(on_owner)

        async def discard() -> None:
            conn.terminate()  # the connection is unusable; the pool replaces it
            await pool.release(conn)
            await pool.close()

        owner.run(discard)
    assert settle(lambda: pg_backends(pg), 0) == 0


POOL_SIZE = 4


@pytest.fixture
def owner() -> Iterator[LoopThread]:
    with LoopThread() as t:
        yield t


@pytest.fixture
def pool(owner: LoopThread, pg: Postgres) -> Iterator[Any]:
    """The recipe's pool on the owner loop thread. Tests close it and check the
    server; if one fails first, this terminates it so the next starts clean."""
    p = recipe.open_pool(owner, pg.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE)
    try:
        yield p
    finally:
        if not unwrap(p).is_closing():
            owner.run(lambda: _terminate(unwrap(p)))


async def _terminate(pool: Any) -> None:
    pool.terminate()


def _close_and_check(pool: Any, pg: Postgres) -> None:
    """Every connection back in the pool, the server seeing exactly those; then none."""
    assert settle(lambda: unwrap(pool).get_idle_size(), POOL_SIZE) == POOL_SIZE
    assert pg_backends(pg) == POOL_SIZE
    recipe.close_pool(pool)
    assert settle(lambda: pg_backends(pg), 0) == 0


def test_pool_from_sixteen_threads(owner: LoopThread, pool: Any, pg: Postgres) -> None:
    """The blocking face under a 16-worker thread pool: every transaction right,
    never more server connections than the pool holds, none left after close."""
    queries = blocking(recipe.open_queries(owner, pool))
    with ThreadPoolExecutor(16) as workers:
        got = list(workers.map(lambda i: recipe.double(pool, i), range(400)))
        whole = list(workers.map(queries.double, range(400)))  # one crossing each
    assert got == whole == [2 * i for i in range(400)]
    _close_and_check(pool, pg)


@pytest.mark.parametrize("caller", CALLERS)
def test_pool_from_other_loops(owner: LoopThread, pool: Any, pg: Postgres, caller: str) -> None:
    """Connections from acquire() are proxies; transactions commit and roll back on
    the owner, from asyncio, uvloop and trio callers."""

    queries = recipe.open_queries(owner, pool)

    async def scenario() -> None:
        import anyio

        async with pool.acquire() as conn:
            assert is_proxy(conn)
            await conn.execute("CREATE TABLE IF NOT EXISTS items (n int)")
            await conn.execute("TRUNCATE items")
            with pytest.raises(ZeroDivisionError):
                async with conn.transaction():
                    await conn.execute("INSERT INTO items VALUES (1)")
                    raise ZeroDivisionError  # rolls back, on the owner
            async with conn.transaction():
                await conn.execute("INSERT INTO items VALUES (2)")
        assert await pool.fetchval("SELECT array_agg(n) FROM items") == [2]
        results = []

        async def one(i: int) -> None:
            results.append(await recipe.double_async(pool, i))

        async def whole(i: int) -> None:
            results.append(await queries.double(i))

        async with anyio.create_task_group() as tg:
            for i in range(64):
                tg.start_soon(one, i)
                tg.start_soon(whole, i)
        assert sorted(results) == sorted(2 * i for i in range(64) for _ in range(2))
        await pool.execute("DROP TABLE items")

    run_caller(caller, scenario)
    _close_and_check(pool, pg)


@pytest.mark.parametrize(("style", "caller"), cancel_params())
def test_cancelling_a_query_from_another_loop(
    pool: Any, pg: Postgres, style: str, caller: str
) -> None:
    """A caller cancelled while its query waits on the server: the query is cancelled
    on the server, the connection goes back to the pool, and the pool still works."""

    async def waits_for_the_lock() -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_lock(7)")

    def blocked() -> None:
        assert settle(lambda: pg_lock_waiters(pg), 1) == 1

    with advisory_lock(pg, 7):
        assert cancelled_midway(style, caller, waits_for_the_lock, blocked)
        assert settle(lambda: pg_lock_waiters(pg), 0) == 0  # cancelled on the server too
    assert run_caller(caller, recipe.double_async, pool, 5) == 10
    _close_and_check(pool, pg)
