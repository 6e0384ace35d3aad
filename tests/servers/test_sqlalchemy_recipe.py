"""The SQLAlchemy AsyncEngine recipe (docs/recipes.md) over asyncpg, on a real server.

First a cached pooled engine used from a second loop, failing as skypilot PR #8725
reports ("got Future attached to a different loop"), and that PR's workaround,
``NullPool``, working at the cost of a new server connection per use; then the
pooled engine through loopbridge from every kind of caller.
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

pytest.importorskip("asyncpg", reason="asyncpg is not installed (group: recipes)")
sqlalchemy = pytest.importorskip(
    "sqlalchemy", reason="sqlalchemy is not installed (group: recipes)"
)
from sqlalchemy import event, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

recipe = load_recipe("sqlalchemy")


def _engine(pg: Postgres, **kw: Any) -> tuple[AsyncEngine, list[int]]:
    """An engine, and a list that grows by one per new server connection it opens."""
    engine = create_async_engine(pg.sqlalchemy_url, **kw)
    connects: list[int] = []
    event.listen(engine.sync_engine, "connect", lambda *_: connects.append(1))
    return engine, connects


async def _one(engine: AsyncEngine) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT 1"))).scalar_one()


@pytest.mark.loopbridge_sanitize("off")  # shows the race itself, unreported
def test_raw_pooled_engine_on_another_loop_fails(pg: Postgres) -> None:
    """The engine's pooled connection was opened on the owner loop; the other loop's
    first statement awaits the owner's future and fails, and the owner's next
    statement finds the connection still busy."""
    with LoopThread() as owner:

        async def make() -> tuple[AsyncEngine, list[int]]:
            return _engine(pg, pool_size=1, max_overflow=0)

        engine, _ = owner.run(make)
        assert owner.run(_one, engine) == 1  # the pool now holds an owner-loop connection

        held = OwnerHeld(owner.loop, then=lambda: _one(engine))
        other = on_other_loop(lambda: _one(engine))
        on_owner = held.release()

        assert isinstance(other, RuntimeError), repr(other)
        assert "attached to a different loop" in str(other)
        assert isinstance(on_owner, sqlalchemy.exc.InterfaceError), repr(on_owner)
        assert "another operation is in progress" in str(on_owner)
        owner.run(engine.dispose)
    assert settle(lambda: pg_backends(pg), 0) == 0


def test_raw_nullpool_workaround_opens_a_connection_per_use(pg: Postgres) -> None:
    """skypilot PR #8725's fix: no pool, so no connection outlives its loop. It works
    from any loop, and every use pays a new server connection (and its backend)."""
    with LoopThread() as owner:

        async def make() -> tuple[AsyncEngine, list[int]]:
            return _engine(pg, poolclass=NullPool)

        engine, connects = owner.run(make)
        uses = 5
        for _ in range(uses):
            assert owner.run(_one, engine) == 1
            assert on_other_loop(lambda: _one(engine)) == 1
        assert len(connects) == 2 * uses
        owner.run(engine.dispose)
    assert settle(lambda: pg_backends(pg), 0) == 0


POOL_SIZE = 4


@pytest.fixture
def pooled(pg: Postgres) -> Iterator[tuple[AsyncEngine, list[int]]]:
    """The recipe's pooled engine on an owner loop thread, and a list that grows by
    one per server connection it opens; disposed at the end either way."""

    async def make() -> list[int]:
        connects: list[int] = []
        event.listen(unwrap(engine).sync_engine, "connect", lambda *_: connects.append(1))
        return connects

    with LoopThread() as owner:
        # pool_pre_ping: a connection whose statement was cancelled can reach the pool
        # already closed, and the next checkout then fails with "connection is closed"
        # (2 of 75 runs of the cancel tests with both cores busy; 0 of 100 with it).
        engine = recipe.open_engine(
            owner, pg.sqlalchemy_url, pool_size=POOL_SIZE, max_overflow=0, pool_pre_ping=True
        )
        connects = owner.run(make)
        try:
            yield engine, connects
        finally:
            blocking(engine).dispose()


def _dispose_and_check(engine: AsyncEngine, pg: Postgres) -> None:
    """Every connection checked in, the server seeing no more than the pool; then none."""
    assert settle(lambda: unwrap(engine).pool.checkedout(), 0) == 0
    assert pg_backends(pg) <= POOL_SIZE
    recipe.close_engine(engine)
    assert settle(lambda: pg_backends(pg), 0) == 0


def test_pooled_engine_from_sixteen_threads(
    pooled: tuple[AsyncEngine, list[int]], pg: Postgres
) -> None:
    """The blocking face under a 16-worker thread pool: every transaction right, and
    the pool, not the callers, decides how many server connections there are."""
    engine, connects = pooled
    with ThreadPoolExecutor(16) as workers:
        got = list(workers.map(lambda i: recipe.double(engine, i), range(400)))
    assert got == [2 * i for i in range(400)]
    assert len(connects) <= POOL_SIZE  # NullPool would have opened 400
    assert pg_backends(pg) == len(connects)
    _dispose_and_check(engine, pg)


@pytest.mark.parametrize("caller", CALLERS)
def test_pooled_engine_from_other_loops(
    pooled: tuple[AsyncEngine, list[int]], pg: Postgres, caller: str
) -> None:
    """The pooled engine used from asyncio, uvloop and trio callers: connections are
    proxies, begin() commits or rolls back on the owner, and the pool is reused."""
    engine, connects = pooled

    async def scenario() -> None:
        import anyio

        async with engine.begin() as conn:
            assert is_proxy(conn)
            await conn.execute(text("CREATE TABLE IF NOT EXISTS items (n int)"))
            await conn.execute(text("TRUNCATE items"))
        with pytest.raises(ZeroDivisionError):
            async with engine.begin() as conn:
                await conn.execute(text("INSERT INTO items VALUES (1)"))
                raise ZeroDivisionError  # rolled back, on the owner
        async with engine.connect() as conn:
            async with conn.begin():
                await conn.execute(text("INSERT INTO items VALUES (2)"))
            rows = (await conn.execute(text("SELECT n FROM items"))).scalars().all()
            assert rows == [2]
        results = []

        async def one(i: int) -> None:
            results.append(await recipe.double_async(engine, i))

        async with anyio.create_task_group() as tg:
            for i in range(64):
                tg.start_soon(one, i)
        assert sorted(results) == [2 * i for i in range(64)]
        async with engine.begin() as conn:
            await conn.execute(text("DROP TABLE items"))

    run_caller(caller, scenario)
    assert len(connects) <= POOL_SIZE
    _dispose_and_check(engine, pg)


@pytest.mark.parametrize(("style", "caller"), cancel_params())
def test_cancelling_a_statement_from_another_loop(
    pooled: tuple[AsyncEngine, list[int]], pg: Postgres, style: str, caller: str
) -> None:
    """A caller cancelled while its statement waits on the server: the connection is
    checked back in (or invalidated and replaced), and the engine still works."""
    engine, _ = pooled

    async def waits_for_the_lock() -> None:
        async with engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_lock(7)"))

    def blocked() -> None:
        assert settle(lambda: pg_lock_waiters(pg), 1) == 1

    with advisory_lock(pg, 7):
        assert cancelled_midway(style, caller, waits_for_the_lock, blocked)
    # SQLAlchemy invalidates a connection interrupted mid-statement; the server
    # ends that session once its lock wait ends.
    assert settle(lambda: pg_lock_waiters(pg), 0) == 0
    assert run_caller(caller, recipe.double_async, engine, 5) == 10
    _dispose_and_check(engine, pg)
