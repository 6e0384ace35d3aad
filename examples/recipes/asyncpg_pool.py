"""One asyncpg pool on one owner loop, used from plain threads and other loops.

A pool and its connections belong to the loop that created them. ``open_pool``
creates the pool on the running loop and returns a proxy for everyone else:
``pool.acquire()`` gives back the connection as a proxy too, so its queries and
transactions run on the owner loop, and leaving ``async with`` (or ``with`` on
the blocking face) releases it there.

Run against a server of yours: DATABASE_URL=postgresql://user@host/db python asyncpg_pool.py
"""

from __future__ import annotations

import asyncio
import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg

from loopbridge import LoopThread, Owned, adopt, blocking, proxy

# A pooled connection's query methods are plain functions returning coroutines,
# one per async method of asyncpg.Connection: each runs on the owner when awaited.
QUERIES = sorted(
    name
    for name, member in vars(asyncpg.Connection).items()
    if inspect.iscoroutinefunction(member) and not name.startswith("_")
)
CONNECTION = Owned(returns={"transaction": Owned(), **{name: Owned() for name in QUERIES}})
POOL_RULES = {"acquire": Owned(returns={"__aenter__": CONNECTION, "__await__": CONNECTION})}


async def open_pool(dsn: str, **options: Any) -> asyncpg.Pool:
    """The pool, owned by the running loop, as a proxy usable from anywhere."""
    pool = await asyncpg.create_pool(dsn, **options)
    return proxy(adopt(pool, returns=POOL_RULES))


def view(pool: asyncpg.Pool, user_id: int) -> int:
    """A sync web view (Flask, Django): one transaction on a pooled connection."""
    with blocking(pool).acquire() as conn, blocking(conn).transaction():
        # fetchval() on a pooled connection is a plain function returning a
        # coroutine: on the blocking face, .result() waits for it.
        return blocking(conn).fetchval("SELECT $1::int * 2", user_id).result()


async def handler(pool: asyncpg.Pool, user_id: int) -> int:
    """The same from another event loop (asyncio, uvloop, or trio through anyio)."""
    async with pool.acquire() as conn, conn.transaction():
        return await conn.fetchval("SELECT $1::int * 2", user_id)


def main() -> None:
    dsn = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
    with LoopThread("db-owner") as owner:
        pool = owner.run(open_pool, dsn)
        with ThreadPoolExecutor(16) as workers:  # a threaded web server's workers
            assert list(workers.map(lambda i: view(pool, i), range(200))) == [
                2 * i for i in range(200)
            ]
        assert asyncio.run(handler(pool, 21)) == 42  # a second loop, on this thread
        blocking(pool).close()  # runs on the owner; the loop closes last
    print("ok")


if __name__ == "__main__":
    main()
