"""One pooled SQLAlchemy AsyncEngine (over asyncpg) on one owner loop, used from
plain threads and other loops.

A pooled engine's connections belong to the loop that opened them; a second loop
using them fails with "attached to a different loop", which is why some projects
fall back to ``NullPool`` and pay a new server connection per use. Here the engine
keeps its pool: ``engine.connect()`` and ``engine.begin()`` give back the
connection as a proxy, so every statement runs on the owner loop.

Run against a server of yours:
SQLALCHEMY_URL=postgresql+asyncpg://user@host/db python sqlalchemy_engine.py
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from loopbridge import LoopThread, Owned, adopt, blocking, proxy

# An AsyncConnection: entering it gives back itself; begin() gives a transaction
# that is entered (or awaited) on the owner too.
CONNECTION = Owned(returns={"begin": Owned(), "begin_nested": Owned()})
ENGINE_RULES = {"connect": CONNECTION, "begin": Owned(returns={"__aenter__": CONNECTION})}


async def open_engine(url: str, **options: Any) -> AsyncEngine:
    """The engine, owned by the running loop, as a proxy usable from anywhere."""
    engine = create_async_engine(url, **options)
    return proxy(adopt(engine, returns=ENGINE_RULES))


def view(engine: AsyncEngine, n: int) -> int:
    """A sync web view (Flask, Django): one transaction on a pooled connection."""
    with blocking(engine).begin() as conn:
        result = blocking(conn).execute(text("SELECT :n * 2"), {"n": n})
        return int(result.scalar_one())


async def handler(engine: AsyncEngine, n: int) -> int:
    """The same from another event loop (asyncio, uvloop, or trio through anyio)."""
    async with engine.connect() as conn, conn.begin():
        result = await conn.execute(text("SELECT :n * 2"), {"n": n})
        return int(result.scalar_one())


def main() -> None:
    url = os.environ.get("SQLALCHEMY_URL", "postgresql+asyncpg://postgres@127.0.0.1/postgres")
    with LoopThread("db-owner") as owner:
        engine = owner.run(open_engine, url)
        with ThreadPoolExecutor(16) as workers:  # a threaded web server's workers
            assert list(workers.map(lambda i: view(engine, i), range(200))) == [
                2 * i for i in range(200)
            ]
        assert asyncio.run(handler(engine, 21)) == 42  # a second loop, on this thread
        blocking(engine).dispose()  # runs on the owner; the loop closes last
    print("ok")


if __name__ == "__main__":
    main()
