"""The asyncpg recipe (docs/recipes.md) against a real PostgreSQL server.

First the raw pool shared between its owner loop and another loop, failing as
asyncpg's users report it; then the same calls through loopbridge, from plain
threads and from asyncio, uvloop and trio callers, cancellation included, with the
server's connection count checked after each.
"""

from __future__ import annotations

from typing import Any

import pytest

from loopbridge import LoopThread

from .conftest import pg_backends, settle
from .crossing import OwnerHeld, on_other_loop
from .launch import Postgres

asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed (group: recipes)")


async def _pool(pg: Postgres, size: int) -> Any:
    return await asyncpg.create_pool(pg.dsn, min_size=size, max_size=size)


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
