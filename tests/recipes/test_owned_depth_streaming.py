"""A bare ``Owned()`` rule covers what the object gives back at every depth, on the
real streaming clients: httpx's ``client.stream(...)`` and aiohttp's
``session.get(...)``, against a uvicorn server on loopback.

The refusal of ``client.stream`` advises ``returns={'stream': loopbridge.Owned()}``.
Followed literally, ``async with client.stream(...) as r`` gives a proxy for the
response too (entering gave it, and no rule named ``__aenter__``), and
``r.aiter_lines()`` streams from the owner loop, from another asyncio loop, from
trio and from a plain thread, with the sanitizer raising (see conftest.py).  The
client's own I/O is recorded by its transport: it all runs on the owner's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

import loopbridge as lb

from .conftest import CALLERS, HttpServer, run_in

httpx = pytest.importorskip("httpx", reason="httpx is not installed (dependency group: recipes)")
aiohttp = pytest.importorskip(
    "aiohttp", reason="aiohttp is not installed (dependency group: recipes)"
)

LINES = [f"line {i}" for i in range(50)]
FACES = [*CALLERS, "thread"]


class Threads:
    """The threads that ran the client's I/O."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def note(self, *args: object) -> None:
        self.seen.add(threading.get_ident())


def _recording_transport(threads: Threads) -> Any:
    class Body(httpx.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __aiter__(self) -> Any:
            async for chunk in self.inner:
                threads.note()
                yield chunk

        async def aclose(self) -> None:
            threads.note()
            await self.inner.aclose()

    class Transport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: Any) -> Any:
            threads.note()
            response = await super().handle_async_request(request)
            response.stream = Body(response.stream)
            return response

    return Transport()


def _owner_thread(owner: lb.LoopThread) -> int:
    return owner.run(_ident)


async def _ident() -> int:
    return threading.get_ident()


def _both(face: str, on_loop: Callable[[], Any], on_thread: Callable[[], Any]) -> Any:
    return on_thread() if face == "thread" else run_in(face, on_loop)


@pytest.mark.parametrize("face", FACES)
def test_httpx_stream_with_the_advised_bare_rule(
    owner: lb.LoopThread, http_server: HttpServer, face: str
) -> None:
    threads = Threads()

    async def make() -> Any:
        client = httpx.AsyncClient(transport=_recording_transport(threads))
        return lb.adopt(client, returns={"stream": lb.Owned()})  # the advice, literally

    client = lb.proxy(owner.run(make))
    url = f"{http_server.url}/lines/{len(LINES)}"

    async def on_loop() -> list[str]:
        async with client.stream("GET", url) as r:
            assert lb.is_proxy(r), f"entering gave a bare {type(r).__qualname__}"
            lines = [line async for line in r.aiter_lines()]
            return lines

    def on_thread() -> list[str]:
        with lb.blocking(client.stream("GET", url)) as r:
            assert lb.is_proxy(r), f"entering gave a bare {type(r).__qualname__}"
            return list(lb.blocking(r).aiter_lines())

    try:
        assert _both(face, on_loop, on_thread) == LINES
    finally:
        lb.blocking(client).aclose()
    assert threads.seen == {_owner_thread(owner)}, "the client's I/O ran off its owner"


@pytest.mark.parametrize("face", FACES)
def test_httpx_response_from_an_owned_response_is_covered_too(
    owner: lb.LoopThread, http_server: HttpServer, face: str
) -> None:
    """What the covered response gives in turn: ``aread()``'s bytes cross as they
    are; the response's undeclared data is refused before any use, naming the
    declaration, never read across threads."""
    threads = Threads()

    async def make() -> Any:
        client = httpx.AsyncClient(transport=_recording_transport(threads))
        return lb.adopt(client, returns={"stream": lb.Owned()})

    client = lb.proxy(owner.run(make))
    url = f"{http_server.url}/lines/3"
    body = b"line 0\nline 1\nline 2\n"

    async def on_loop() -> bytes:
        async with client.stream("GET", url) as r:
            with pytest.raises(lb.LoopAffinityError, match="status_code"):
                r.status_code  # noqa: B018 - refused: not declared stable
            return bytes(await r.aread())

    def on_thread() -> bytes:
        with lb.blocking(client.stream("GET", url)) as r:
            with pytest.raises(lb.LoopAffinityError, match="status_code"):
                r.status_code  # noqa: B018
            return bytes(lb.blocking(r).aread())

    try:
        assert _both(face, on_loop, on_thread) == body
    finally:
        lb.blocking(client).aclose()
    assert threads.seen == {_owner_thread(owner)}


@pytest.mark.parametrize("face", FACES)
def test_aiohttp_response_with_a_bare_rule(
    owner: lb.LoopThread, http_server: HttpServer, face: str
) -> None:
    """``returns={'get': Owned()}``: entering ``session.get(...)`` gives the response
    as a proxy (it was an uncovered result before), and its body streams from the
    owner: ``content`` under its own rule, iterated line by line."""
    threads = Threads()
    url = f"{http_server.url}/lines/{len(LINES)}"
    want = [f"{line}\n".encode() for line in LINES]

    async def make(rule: lb.Owned) -> Any:
        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(_noted(threads))
        trace.on_response_chunk_received.append(_noted(threads))
        session = aiohttp.ClientSession(trace_configs=[trace])
        return lb.adopt(session, returns={"get": rule})

    bare = lb.proxy(owner.run(make, lb.Owned()))
    body_rule = lb.Owned(returns={"__aenter__": lb.Owned(returns={"content": lb.Owned()})})
    streaming = lb.proxy(owner.run(make, body_rule))

    async def on_loop() -> tuple[str, list[bytes]]:
        async with bare.get(url) as r:
            assert lb.is_proxy(r)
            text = await r.text()
        async with streaming.get(url) as r:
            assert lb.is_proxy(r) and lb.is_proxy(r.content)
            lines = [line async for line in r.content]
        return text, lines

    def on_thread() -> tuple[str, list[bytes]]:
        with lb.blocking(bare.get(url)) as r:
            assert lb.is_proxy(r)
            text = lb.blocking(r).text()
        with lb.blocking(streaming.get(url)) as r:
            lines = list(lb.blocking(r.content))
        return text, lines

    try:
        text, lines = _both(face, on_loop, on_thread)
    finally:
        lb.blocking(bare).close()
        lb.blocking(streaming).close()
    assert text == "".join(f"{line}\n" for line in LINES)
    assert lines == want
    assert threads.seen == {_owner_thread(owner)}


def _noted(threads: Threads) -> Callable[..., Any]:
    async def noted(*args: object) -> None:
        threads.note()

    return noted
