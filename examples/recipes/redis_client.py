"""One redis.asyncio client on one owner loop, used from plain threads and other
loops: commands, pipelines, and pub/sub consumed as a stream.

A client's pooled connections belong to the loop that opened them; another loop
using the client fails with "attached to a different loop" after the server has
already run the command. Here every command runs on the owner loop. redis-py's
command methods are plain functions returning coroutines, so each gets a rule:
awaited through the proxy, it runs on the owner. A pipeline only buffers commands
until ``execute()``, so its command methods run where they are called; a pub/sub
object's ``listen()`` streams messages from the owner.

Run against a server of yours: REDIS_URL=redis://host:6379/0 python redis_client.py
"""

from __future__ import annotations

import asyncio
import inspect
import os
from concurrent.futures import ThreadPoolExecutor

import redis.asyncio as aioredis

from loopbridge import LoopThread, Owned, adopt, blocking, proxy

COMMANDS = sorted(
    name
    for name, member in inspect.getmembers(aioredis.Redis, inspect.isfunction)
    if member.__module__.startswith("redis.commands") and not name.startswith("_")
)
PIPELINE = Owned(threadsafe=COMMANDS)  # buffering only; execute() runs on the owner
SUBSCRIPTIONS = ("subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ping")
PUBSUB = Owned(returns={name: Owned() for name in SUBSCRIPTIONS})  # listen() streams
CLIENT_RULES = {"pipeline": PIPELINE, "pubsub": PUBSUB, **{n: Owned() for n in COMMANDS}}


async def open_client(url: str) -> aioredis.Redis:
    """The client, owned by the running loop, as a proxy usable from anywhere."""
    client = aioredis.Redis.from_url(url)
    return proxy(adopt(client, returns=CLIENT_RULES))


def view(client: aioredis.Redis, key: str) -> list[int]:
    """A sync web view (Flask, Django): a command and a transaction."""
    redis = blocking(client)
    redis.incr(key).result()  # a command is a pending result: .result() waits for it
    with redis.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.incr(key)
        return blocking(pipe).execute()


async def handler(client: aioredis.Redis, key: str) -> list[int]:
    """The same from another event loop (asyncio, uvloop, or trio through anyio)."""
    await client.incr(key)
    async with client.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.incr(key)
        return await pipe.execute()


async def consume(client: aioredis.Redis, channel: str, n: int) -> list[bytes]:
    """Pub/sub as a stream: the first ``n`` messages published on ``channel``."""
    async with client.pubsub() as pubsub:
        await pubsub.subscribe(channel)
        out: list[bytes] = []
        async for message in pubsub.listen():  # the reader runs on the owner loop
            if message["type"] == "subscribe":
                await client.publish(channel, b"hello")  # after the subscription
            elif message["type"] == "message":
                out.append(message["data"])
                if len(out) == n:
                    break  # closes listen() on the owner
        return out


def main() -> None:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    with LoopThread("redis-owner") as owner:
        client = owner.run(open_client, url)
        blocking(client).delete("hits").result()
        with ThreadPoolExecutor(16) as workers:  # a threaded web server's workers
            done = list(workers.map(lambda _: view(client, "hits"), range(100)))
        assert sorted(x for pair in done for x in pair)[-1] == 300
        assert asyncio.run(handler(client, "hits"))[-1] == 303  # a second loop
        assert asyncio.run(consume(client, "news", 1)) == [b"hello"]
        blocking(client).aclose()  # runs on the owner; the loop closes last
    print("ok")


if __name__ == "__main__":
    main()
