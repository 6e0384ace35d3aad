"""Session-wide real servers for the recipe tests, and server-side connection counts.

One PostgreSQL cluster and one redis-server start for the whole session (``launch``)
and stop at its end. A test that needs one is skipped only when it cannot start, and
the skip reason gives the cause. The client libraries (the ``recipes`` dependency
group) are imported with ``importorskip`` for the same reason: the suite still runs
where they are not installed.

Leak checks count connections on the server, not in the client: what a leaked
connection costs is a backend process or a client slot there. A server ends a
closed connection on its own schedule, so ``settle`` waits (bounded) for the count
to reach the expected value and returns the last count read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator

import pytest

from loopbridge import LoopThread

from .launch import Postgres, Redis, ServerUnavailable, postgres, redis


@pytest.fixture(scope="session")
def pg() -> Iterator[Postgres]:
    pytest.importorskip("asyncpg", reason="asyncpg is not installed (dependency group: recipes)")
    try:
        with postgres() as server:
            yield server
    except ServerUnavailable as e:
        pytest.skip(f"no PostgreSQL server: {e}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Redis]:
    pytest.importorskip("redis", reason="redis is not installed (dependency group: recipes)")
    try:
        with redis() as server:
            yield server
    except ServerUnavailable as e:
        pytest.skip(f"no Redis server: {e}")


def _pg_count(server: Postgres, where: str) -> int:
    """Sessions of the test database matching ``where``, not counting the one asking."""
    import asyncpg

    async def count() -> int:
        conn = await asyncpg.connect(server.dsn)
        try:
            n = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                f"AND pid <> pg_backend_pid() AND {where}",
                server.database,
            )
            return int(n)
        finally:
            await conn.close()

    return asyncio.run(count())


def pg_backends(server: Postgres) -> int:
    """Client connections to the test database now."""
    return _pg_count(server, "backend_type = 'client backend'")


def pg_lock_waiters(server: Postgres) -> int:
    """Sessions of the test database waiting for a lock now."""
    return _pg_count(server, "wait_event_type = 'Lock'")


@contextlib.contextmanager
def advisory_lock(server: Postgres, key: int) -> Iterator[None]:
    """Holds PostgreSQL advisory lock ``key`` from a connection of its own while the
    block runs: a statement taking the same lock waits on the server meanwhile."""
    import asyncpg

    with LoopThread("lock-holder") as holder:
        conn = holder.run(asyncpg.connect, server.dsn)
        try:
            holder.run(conn.execute, f"SELECT pg_advisory_lock({int(key)})")
            yield
        finally:
            holder.run(conn.close)


def redis_clients(server: Redis) -> int:
    """Client connections to the server now, not counting the one asking."""
    import redis as sync_redis

    client = sync_redis.Redis(host=server.host, port=server.port)
    try:
        return len(client.client_list()) - 1
    finally:
        client.close()


def redis_blocked(server: Redis) -> int:
    """Clients blocked in a command (BLPOP and the like) now."""
    import redis as sync_redis

    client = sync_redis.Redis(host=server.host, port=server.port)
    try:
        return int(client.info("clients")["blocked_clients"])
    finally:
        client.close()


def settle(count: Callable[[], int], expected: int, timeout: float = 5.0) -> int:
    """Read ``count()`` until it equals ``expected`` or ``timeout`` passes; the last value.

    The server ends a closed connection's backend after the client has gone, and
    reports no event for it, so this one place reads again until it agrees.
    """
    deadline = time.monotonic() + timeout
    n = count()
    while n != expected and time.monotonic() < deadline:
        time.sleep(0.02)
        n = count()
    return n
