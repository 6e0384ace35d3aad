"""The grpc.aio recipe (docs/recipes.md) against an in-process grpc.aio server on
loopback: a unary call and a server stream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import loopbridge as lb
from loopbridge.sanitizer import sanitize

from .common import cancel_when, concurrently, from_threads
from .conftest import CALLERS, GrpcServer, owner_busy, run_in
from .recipe import load_recipe

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (dependency group: recipes)")
recipe = load_recipe("grpc")


def test_raw_channel_fails_across_loops_and_the_recipe_does_not(
    owner: lb.LoopThread, grpc_server: GrpcServer
) -> None:
    async def make() -> tuple[Any, Any]:
        channel = grpc.aio.insecure_channel(grpc_server.target)
        return channel, recipe.EchoStub(channel)

    raw_channel, raw_stub = owner.run(make)

    async def say(name: bytes) -> bytes:
        return await raw_stub.Say(name)  # type: ignore[no-any-return]

    assert owner.run(say, b"owner") == b"hello owner"
    # grpc/grpc#32480: a call made from another loop runs on the channel's loop.
    # Shown without the sanitizer (which would report the misuse first).
    with (
        sanitize("off"),
        owner_busy(owner),
        pytest.raises(RuntimeError, match="attached to a different loop"),
    ):
        asyncio.run(say(b"other"))
    owner.run(raw_channel.close)

    channel, stub = recipe.open_stub(owner, grpc_server.target)
    try:
        assert asyncio.run(recipe.say(stub, b"other")) == b"hello other"
        assert recipe.say_blocking(stub, b"thread") == b"hello thread"
    finally:
        recipe.close_channel(channel)


def test_from_sync_threads(owner: lb.LoopThread, grpc_server: GrpcServer) -> None:
    channel, stub = recipe.open_stub(owner, grpc_server.target)
    try:
        got = from_threads(lambda i: recipe.say_blocking(stub, str(i).encode()), 200)
        assert got == [b"hello " + str(i).encode() for i in range(200)]
        streams = from_threads(lambda i: recipe.count_blocking(stub, i), 32)
        assert streams == [[str(j).encode() for j in range(i)] for i in range(32)]
    finally:
        recipe.close_channel(channel)


@pytest.mark.parametrize("caller", CALLERS)
def test_from_other_loops(owner: lb.LoopThread, grpc_server: GrpcServer, caller: str) -> None:
    channel, stub = recipe.open_stub(owner, grpc_server.target)
    app = grpc_server.app

    async def main() -> None:
        got = await concurrently(lambda i: recipe.say(stub, str(i).encode()), 100)
        assert got == [b"hello " + str(i).encode() for i in range(100)]
        items = [m async for m in recipe.count(stub, 1000)]
        assert items == [str(i).encode() for i in range(1000)]
        # A unary call cancelled by the caller is cancelled on the server.
        await cancel_when(app.hang_started, lambda: stub.Hang(b""))
        # A server stream left early is cancelled on the server too.
        stream = stub.Count(b"1000000000").__aiter__()
        assert await stream.__anext__() == b"0"
        await stream.aclose()  # type: ignore[attr-defined]

    try:
        run_in(caller, main)
        assert app.hang_cancelled.wait(30), "the server never saw the unary call's cancel"
        assert app.count_cancelled.wait(30), "the server never saw the stream's cancel"
    finally:
        recipe.close_channel(channel)
