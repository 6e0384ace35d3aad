"""The redis.asyncio recipe (docs/recipes.md) against a real redis-server.

First one client shared between its owner loop and another loop, failing as
redis-py #2838 and #3351 report ("got Future attached to a different loop"), for a
command and for a pipeline; worse than the error, the server has run the command
the caller was told failed. Then the client, its pipelines and pub/sub through
loopbridge from every kind of caller.
"""

from __future__ import annotations

from typing import Any

import pytest

from loopbridge import LoopThread

from .conftest import redis_clients, settle
from .crossing import OwnerHeld, on_other_loop
from .launch import Redis

aioredis = pytest.importorskip("redis.asyncio", reason="redis is not installed (group: recipes)")


async def _client(server: Redis) -> Any:
    client = aioredis.Redis.from_url(server.url)
    await client.ping()  # the pool now holds a connection opened on the owner loop
    return client


async def _pipelined(client: Any, key: str) -> Any:
    async with client.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.incr(key)
        return await pipe.execute()


def test_raw_client_shared_with_another_loop_fails(redis_server: Redis) -> None:
    """The other loop's command is written, then its task awaits the owner loop's
    stream reader: "attached to a different loop". The server ran it anyway, so a
    caller that retries on the error applies it twice. The same for a pipeline."""
    with LoopThread() as owner:
        client = owner.run(_client, redis_server)
        owner.run(client.delete, "raw")

        held = OwnerHeld(owner.loop, then=lambda: client.incr("raw"))
        other = on_other_loop(lambda: client.incr("raw"))
        on_owner = held.release()
        assert isinstance(other, RuntimeError), repr(other)
        assert "attached to a different loop" in str(other)
        assert on_owner == 2  # the failed INCR was applied

        held = OwnerHeld(owner.loop, then=lambda: _pipelined(client, "raw"))
        other = on_other_loop(lambda: _pipelined(client, "raw"))
        on_owner = held.release()
        assert isinstance(other, RuntimeError), repr(other)
        assert "attached to a different loop" in str(other)
        assert on_owner == [5, 6]  # and so was the failed pipeline

        owner.run(client.delete, "raw")
        owner.run(client.aclose)
    assert settle(lambda: redis_clients(redis_server), 0) == 0
