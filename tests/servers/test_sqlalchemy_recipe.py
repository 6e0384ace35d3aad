"""The SQLAlchemy AsyncEngine recipe (docs/recipes.md) over asyncpg, on a real server.

First a cached pooled engine used from a second loop, failing as skypilot PR #8725
reports ("got Future attached to a different loop"), and that PR's workaround,
``NullPool``, working at the cost of a new server connection per use; then the
pooled engine through loopbridge from every kind of caller.
"""

from __future__ import annotations

from typing import Any

import pytest

from loopbridge import LoopThread

from .conftest import pg_backends, settle
from .crossing import OwnerHeld, on_other_loop
from .launch import Postgres

pytest.importorskip("asyncpg", reason="asyncpg is not installed (group: recipes)")
sqlalchemy = pytest.importorskip(
    "sqlalchemy", reason="sqlalchemy is not installed (group: recipes)"
)
from sqlalchemy import event, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402


def _engine(pg: Postgres, **kw: Any) -> tuple[AsyncEngine, list[int]]:
    """An engine, and a list that grows by one per new server connection it opens."""
    engine = create_async_engine(pg.sqlalchemy_url, **kw)
    connects: list[int] = []
    event.listen(engine.sync_engine, "connect", lambda *_: connects.append(1))
    return engine, connects


async def _one(engine: AsyncEngine) -> Any:
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT 1"))).scalar_one()


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
