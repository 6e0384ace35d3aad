"""The redis.asyncio recipe (docs/recipes.md) against a real redis-server.

First one client shared between its owner loop and another loop, failing as
redis-py #2838 and #3351 report ("got Future attached to a different loop"), for a
command and for a pipeline; worse than the error, the server has run the command
the caller was told failed. Then the client, its pipelines and pub/sub through
loopbridge from every kind of caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from recipes.recipe import load_recipe

from loopbridge import LoopThread, blocking, is_proxy, unwrap

from .conftest import redis_blocked, redis_clients, settle
from .crossing import (
    CALLERS,
    OwnerHeld,
    cancel_params,
    cancelled_midway,
    on_other_loop,
    run_caller,
)
from .launch import Redis

# The recipe runs with the affinity sanitizer raising: a client used off its owner
# loop anywhere in it, its streaming paths included, fails the test.
pytestmark = pytest.mark.loopbridge_sanitize("raise")

aioredis = pytest.importorskip("redis.asyncio", reason="redis is not installed (group: recipes)")
recipe = load_recipe("redis")


async def _client(server: Redis) -> Any:
    client = aioredis.Redis.from_url(server.url)
    await client.ping()  # the pool now holds a connection opened on the owner loop
    return client


async def _pipelined(client: Any, key: str) -> Any:
    async with client.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.incr(key)
        return await pipe.execute()


@pytest.mark.loopbridge_sanitize("off")  # shows the race itself, unreported
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


@pytest.fixture
def client(redis_server: Redis) -> Iterator[Any]:
    """The recipe's client on an owner loop thread; closed at the end either way."""
    with LoopThread() as owner:
        c = recipe.open_client(owner, redis_server.url)
        blocking(c).delete("hits", "queue", "a")
        try:
            yield c
        finally:
            blocking(c).aclose()


def _pooled(client: Any) -> int:
    """Open connections idle in the client's pool; asserts none is still lent out.
    The server must see exactly these."""
    pool = unwrap(client).connection_pool
    assert not pool._in_use_connections
    return sum(1 for c in pool._available_connections if c.is_connected)


def _close_and_check(client: Any, server: Redis) -> None:
    assert settle(lambda: redis_clients(server), _pooled(client)) == _pooled(client)
    recipe.close_client(client)
    assert settle(lambda: redis_clients(server), 0) == 0


def test_client_from_sixteen_threads(client: Any, redis_server: Redis) -> None:
    """Commands and transactions from a 16-worker thread pool: every increment
    counted once, no more server connections than the client's pool opened."""
    with ThreadPoolExecutor(16) as workers:
        got = list(workers.map(lambda _: recipe.count_hit(client, "hits"), range(200)))
    assert sorted(n for pair in got for n in pair)[-1] == 600
    assert int(blocking(client).get("hits")) == 600
    assert _pooled(client) <= 16
    _close_and_check(client, redis_server)


@pytest.mark.parametrize("caller", CALLERS)
def test_client_and_pubsub_from_other_loops(client: Any, redis_server: Redis, caller: str) -> None:
    """Commands, pipelines and a pub/sub stream from asyncio, uvloop and trio."""

    async def scenario() -> None:
        import anyio

        async def one(_: int) -> None:
            await recipe.count_hit_async(client, "hits")

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
        assert int(await client.get("hits")) == 150
        async with client.pipeline(transaction=True) as pipe:
            assert is_proxy(pipe)
            pipe.set("a", 1)
            pipe.incr("a")
            assert await pipe.execute() == [True, 2]
        assert await recipe.first_messages(client, "news", 3) == [b"0", b"1", b"2"]

        # A longer stream: 200 messages, published after the subscription.
        async with client.pubsub() as pubsub:
            assert is_proxy(pubsub)
            await pubsub.subscribe("feed")
            seen: list[bytes] = []
            async for message in pubsub.listen():
                if message["type"] == "subscribe":
                    for i in range(200):
                        await client.publish("feed", str(i))
                elif message["type"] == "message":
                    seen.append(message["data"])
                    if len(seen) == 200:
                        break
            assert seen == [str(i).encode() for i in range(200)]
        assert await client.pubsub_numsub("feed") == [(b"feed", 0)]

    run_caller(caller, scenario)
    _close_and_check(client, redis_server)


@pytest.mark.parametrize(("style", "caller"), cancel_params())
def test_cancelling_a_blocked_command(
    client: Any, redis_server: Redis, style: str, caller: str
) -> None:
    """A caller cancelled in BLPOP: the server no longer sees it blocked, the
    interrupted connection is closed, and the client still works."""

    async def blpop() -> None:
        await client.blpop(["queue"], timeout=0)  # waits forever for an item

    def blocked() -> None:
        assert settle(lambda: redis_blocked(redis_server), 1) == 1

    assert cancelled_midway(style, caller, blpop, blocked)
    assert settle(lambda: redis_blocked(redis_server), 0) == 0
    blocking(client).rpush("queue", "x")  # nobody took it: BLPOP ended
    assert blocking(client).lpop("queue") == b"x"
    _close_and_check(client, redis_server)


@pytest.mark.parametrize(("style", "caller"), cancel_params())
def test_cancelling_a_pubsub_stream(
    client: Any, redis_server: Redis, style: str, caller: str
) -> None:
    """A caller cancelled while its pub/sub stream waits for a message: the stream
    and the pub/sub object close on the owner, so the server sees no subscriber."""

    def numsub() -> int:
        return int(dict(blocking(client).pubsub_numsub("feed"))[b"feed"])

    def subscribed() -> None:
        assert settle(numsub, 1) == 1

    async def listen() -> None:
        async with client.pubsub() as pubsub:
            await pubsub.subscribe("feed")
            async for _ in pubsub.listen():
                pass

    assert cancelled_midway(style, caller, listen, subscribed)
    assert settle(numsub, 0) == 0  # the stream's exit unsubscribed, on the owner
    _close_and_check(client, redis_server)
