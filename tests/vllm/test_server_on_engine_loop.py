"""vLLM's real OpenAI app served on the engine's own loop (``on_engine_loop=True``).

The topology of ``vllm serve``, in the caller's process: the engine on a loop that
runs nothing else, the HTTP server on that loop too, every other user (a trainer's
calls) through the proxy from loops of their own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import MutableMapping
from typing import Any, ClassVar

import httpx
import pytest
from starlette.middleware import Middleware
from vllm_engines import Stream, read_stream, unfinished_requests
from vllm_load import run_load

from loopbridge import LoopThread
from loopbridge_vllm import astart_openai_server, start_openai_server

BOUND_S = 60.0


class _Where:
    """ASGI middleware: records the thread every HTTP request ran on."""

    threads: ClassVar[set[threading.Thread]] = set()

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            _Where.threads.add(threading.current_thread())
        await self.app(scope, receive, send)


async def _stream_tokens(url: str, max_tokens: int) -> Stream:
    """One long stream through the official ``openai`` client, its token ids read back."""
    import openai

    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none") as client:
        out = Stream()
        start = client.completions.create(
            model="tiny",
            prompt="x",
            max_tokens=max_tokens,
            stream=True,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        await read_stream(start, out)
    return out


@pytest.mark.every_release
def test_serves_on_the_engine_loop_while_another_loop_drives_the_engine(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    """Requests run on the owner's thread; a trainer's loop changes the engine meanwhile
    through the proxy; a stop leaves the owner loop and the engine serving."""
    owner, llm = shared_engine
    _Where.threads.clear()
    threads_before = set(threading.enumerate())
    server = start_openai_server(
        engine_proxy, on_engine_loop=True, grace=1.0, middleware=[Middleware(_Where)]
    )
    try:
        assert server.thread is owner.thread and server.running
        assert set(threading.enumerate()) <= threads_before  # no thread of its own

        async def trainer_and_clients() -> tuple[Any, Stream]:
            # The trainer's loop (this one) reaches the engine through the proxy
            # while mixed HTTP load and a long stream run on the engine's loop.
            stream = asyncio.ensure_future(_stream_tokens(server.url, 64))
            load = asyncio.ensure_future(
                run_load(server.url, 48, 12, stream_fraction=0.5, chat_fraction=0.5, seed=3)
            )
            for step in (0.002, 0.0):
                await engine_proxy.collective_rpc("standin_set_step_s", args=(step,))
            return await load, await stream

        result, streamed = asyncio.run(trainer_and_clients())
        assert result.failures == [] and result.ok == 48
        # Every token of the long stream, none dropped.
        assert streamed.error is None and streamed.finish == "length"
        assert len(streamed.ids) == 64
        assert _Where.threads == {owner.thread}
    finally:
        server.stop(timeout=BOUND_S)
    assert server.wait_stopped(0) and not server.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=BOUND_S)
    # The owner loop goes on, and so does the engine.
    assert owner.running and owner.loop.is_running() and not engine_proxy.errored
    assert owner.run(_count, llm) == 0


async def _count(llm: Any) -> int:
    return unfinished_requests(llm)


def test_an_actor_starts_and_closes_it_on_its_engine_loop(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    """The Ray actor's shape: ``astart_openai_server`` and ``aclose`` awaited on the
    engine's own loop, which keeps running the engine meanwhile."""
    owner, _ = shared_engine

    async def on_engine_loop() -> Any:
        server = await astart_openai_server(engine_proxy, on_engine_loop=True, grace=1.0)
        assert server.running and server.thread is threading.current_thread()
        # Served by this very loop: the request must not block it.
        async with httpx.AsyncClient(base_url=server.url, timeout=BOUND_S) as client:
            reply = await client.get("/v1/models")
        await server.aclose()
        return server, reply.json()

    server, models = owner.run(on_engine_loop)
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert server.wait_stopped(0) and owner.loop.is_running()


def test_use_uvloop_is_refused_with_on_engine_loop(engine_proxy: Any) -> None:
    """The loop is the engine's: a choice of the server thread's loop cannot be honoured."""
    threads_before = set(threading.enumerate())
    for choice in (True, False):
        with pytest.raises(ValueError, match="leave use_uvloop out"):
            start_openai_server(engine_proxy, on_engine_loop=True, use_uvloop=choice)
    assert set(threading.enumerate()) <= threads_before
