"""The aiohttp recipe (docs/recipes.md) against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import loopbridge as lb
from loopbridge.sanitizer import sanitize

from .common import cancel_when, concurrently, from_threads
from .conftest import CALLERS, HttpServer, owner_busy, run_in
from .recipe import load_recipe

aiohttp = pytest.importorskip(
    "aiohttp", reason="aiohttp is not installed (dependency group: recipes)"
)
recipe = load_recipe("aiohttp")


def _acquired(session: Any) -> int:
    """Connections handed out and not released (a leak if any remain)."""
    return len(lb.unwrap(session).connector._acquired)


def test_raw_session_fails_across_loops_and_the_recipe_does_not(
    http_server: HttpServer,
) -> None:
    url = http_server.url
    with lb.LoopThread(name="raw-owner") as raw_owner:

        async def make() -> Any:
            return aiohttp.ClientSession()

        raw = raw_owner.run(make)

        async def get(n: int) -> Any:
            async with raw.get(f"{url}/json/{n}") as response:
                return await response.json()

        assert raw_owner.run(get, 1) == {"n": 1}
        # aio-libs/aiohttp#1921: used from another loop, it fails at once.
        # Shown without the sanitizer (which would report the misuse first).
        with (
            sanitize("off"),
            owner_busy(raw_owner),
            pytest.raises(RuntimeError, match="inside a task"),
        ):
            asyncio.run(get(2))
    # aio-libs/aiohttp#10153: once its own loop has closed, "Event loop is closed".
    with sanitize("off"), pytest.raises(RuntimeError, match="Event loop is closed"):
        asyncio.run(get(3))
    raw._connector = None  # its loop is gone: nothing can close it now (no warning at exit)

    with lb.LoopThread(name="recipe-owner") as owner:
        session = recipe.open_session(owner)
        try:
            assert asyncio.run(recipe.get_json(session, f"{url}/json/4")) == {"n": 4}
            assert recipe.get_json_blocking(session, f"{url}/json/5") == {"n": 5}
            assert _acquired(session) == 0
        finally:
            recipe.close_session(session)


def test_from_sync_threads(owner: lb.LoopThread, http_server: HttpServer) -> None:
    url = http_server.url
    connector_limit = 8

    async def make_connector() -> Any:
        return aiohttp.TCPConnector(limit=connector_limit)

    session = recipe.open_session(owner, connector=owner.run(make_connector))
    try:
        got = from_threads(lambda i: recipe.get_json_blocking(session, f"{url}/json/{i}"), 200)
        assert got == [{"n": i} for i in range(200)]
        with lb.blocking(session.post(f"{url}/echo", json={"a": 1})) as response:
            assert response.status == 200 and response.ok
            assert lb.blocking(response).json() == {"echo": {"a": 1}}
        assert lb.blocking(session.get(f"{url}/json/7")).result().status == 200
        with lb.blocking(session.get(f"{url}/lines/3")) as response:
            lines = list(lb.blocking(response.content).iter_chunked(4))
            assert b"".join(lines) == b"line 0\nline 1\nline 2\n"
        assert _acquired(session) <= 1  # the awaited (never released) response above
    finally:
        recipe.close_session(session)
    assert lb.unwrap(session).closed


@pytest.mark.parametrize("caller", CALLERS)
def test_from_other_loops(owner: lb.LoopThread, http_server: HttpServer, caller: str) -> None:
    url = http_server.url
    session = recipe.open_session(owner)

    async def main() -> None:
        got = await concurrently(lambda i: recipe.get_json(session, f"{url}/json/{i}"), 100)
        assert got == [{"n": i} for i in range(100)]
        lines = await recipe.read_lines(session, f"{url}/lines/500")
        assert lines == [f"line {i}\n".encode() for i in range(500)]
        response = await session.get(f"{url}/json/9")  # awaited, not entered
        assert lb.is_proxy(response) and await response.json() == {"n": 9}
        async with response:  # the response's own context: released on the owner
            pass
        # Cancellation while the request is in flight: cancelled on the owner,
        # and the connection is closed (the server sees it), not leaked.
        await cancel_when(http_server.app.slow_started, lambda: session.get(f"{url}/slow"))

    try:
        run_in(caller, main)
        assert http_server.app.disconnected.wait(30), "the server never saw the cancel"
        assert _acquired(session) == 0
    finally:
        recipe.close_session(session)
