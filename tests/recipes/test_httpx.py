"""The httpx recipe (docs/recipes.md) against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import loopbridge as lb
from loopbridge.sanitizer import sanitize

from .common import cancel_when, concurrently, from_threads
from .conftest import CALLERS, HttpServer, owner_busy, run_in
from .recipe import load_recipe

httpx = pytest.importorskip("httpx", reason="httpx is not installed (dependency group: recipes)")
recipe = load_recipe("httpx")


def _pool_connections(client: Any) -> list[Any]:
    return list(lb.unwrap(client)._transport._pool.connections)


def test_raw_client_fails_across_loops_and_the_recipe_does_not(
    owner: lb.LoopThread, http_server: HttpServer
) -> None:
    url = http_server.url

    async def make() -> Any:
        return httpx.AsyncClient()

    raw = owner.run(make)

    async def get(n: int) -> Any:
        return (await raw.get(f"{url}/json/{n}")).json()

    assert owner.run(get, 1) == {"n": 1}  # its pool now holds a connection of the owner loop
    # encode/httpx#2058, #2473: shared with another loop, the pooled connection's
    # primitives are bound to the owner loop.
    # Shown without the sanitizer (which would report the misuse first).
    with (
        sanitize("off"),
        owner_busy(owner),
        pytest.raises(RuntimeError, match="is bound to a different event loop"),
    ):
        asyncio.run(get(2))
    owner.run(raw.aclose)

    client = recipe.open_client(owner)
    try:
        assert asyncio.run(recipe.get_json(client, f"{url}/json/3")) == {"n": 3}
        assert recipe.get_json_blocking(client, f"{url}/json/4") == {"n": 4}
        assert owner.run(recipe.get_json, client, f"{url}/json/5") == {"n": 5}  # on the owner
    finally:
        recipe.close_client(client)


def test_from_sync_threads(owner: lb.LoopThread, http_server: HttpServer) -> None:
    url = http_server.url
    client = recipe.open_client(owner, limits=httpx.Limits(max_connections=8))
    try:
        got = from_threads(lambda i: recipe.get_json_blocking(client, f"{url}/json/{i}"), 200)
        assert got == [{"n": i} for i in range(200)]
        # A streamed response from a plain thread: entered and read on the owner.
        with lb.blocking(client.stream("GET", f"{url}/lines/3")) as response:
            assert lb.is_proxy(response) and response.status_code == 200
            assert list(lb.blocking(response).aiter_lines()) == ["line 0", "line 1", "line 2"]
        assert len(_pool_connections(client)) <= 8
    finally:
        recipe.close_client(client)
    assert _pool_connections(client) == []  # closed: nothing left open


@pytest.mark.parametrize("caller", CALLERS)
def test_from_other_loops(owner: lb.LoopThread, http_server: HttpServer, caller: str) -> None:
    url = http_server.url
    client = recipe.open_client(owner)

    async def main() -> None:
        got = await concurrently(lambda i: recipe.get_json(client, f"{url}/json/{i}"), 100)
        assert got == [{"n": i} for i in range(100)]
        lines = await recipe.read_lines(client, f"{url}/lines/500")
        assert lines == [f"line {i}" for i in range(500)]
        # Cancellation: the owner-side request is cancelled, and httpx closes the
        # connection, which the server sees.
        await cancel_when(http_server.app.slow_started, lambda: client.get(f"{url}/slow"))

    try:
        run_in(caller, main)
        assert http_server.app.disconnected.wait(30), "the server never saw the cancel"
    finally:
        recipe.close_client(client)
