"""vLLM's real OpenAI app on its own thread, bound to the proxy."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
from typing import Any

import httpx
import pytest
from vllm_engines import settled_counts
from vllm_load import run_load

from loopbridge import LoopAffinityError, LoopThread, blocking
from loopbridge_vllm import OpenAIServer, start_openai_server
from loopbridge_vllm.server import serve_args


@pytest.mark.every_release
def test_routes_answer_over_real_http(shared_server: OpenAIServer) -> None:
    url = shared_server.url
    assert shared_server.port != 0 and url.endswith(f":{shared_server.port}")
    assert shared_server.thread is not threading.main_thread()
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/health").status_code == 200
        models = client.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 5, "ignore_eos": True}
        done = client.post("/v1/completions", json=body).json()
        assert done["usage"]["completion_tokens"] == 5
        assert done["choices"][0]["finish_reason"] == "length"
        chat = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "ignore_eos": True,
        }
        reply = client.post("/v1/chat/completions", json=chat).json()
        assert reply["usage"]["completion_tokens"] == 4
        chunks = []
        with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        tokens = client.post("/tokenize", json={"model": "tiny", "prompt": "Hello"}).json()
        assert tokens["count"] >= 1


def test_mixed_load(shared_server: OpenAIServer) -> None:
    result = asyncio.run(
        run_load(shared_server.url, 96, 24, stream_fraction=0.5, chat_fraction=0.5, seed=1)
    )
    assert result.failures == [] and result.ok == 96


def test_no_signal_handlers_and_bounded_stop(engine_proxy: Any) -> None:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    threads_before = set(threading.enumerate())
    server = start_openai_server(engine_proxy, port=0, grace=1.0)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/v1/models").status_code == 200
    server.stop(timeout=10)
    assert not server.thread.is_alive() and not server.running
    # The port is closed ...
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    # ... no thread was left behind, and the engine is still serving others.
    assert set(threading.enumerate()) <= threads_before
    assert not engine_proxy.errored


@pytest.mark.every_release
@pytest.mark.parametrize("on_engine_loop", [False, True], ids=["own-thread", "on-engine-loop"])
def test_stop_drains_a_running_stream_then_cancels_it(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any, on_engine_loop: bool
) -> None:
    owner, llm = shared_engine
    # A plain thread drives the proxy through its blocking face.
    blocking(engine_proxy).collective_rpc("standin_set_step_s", args=(0.05,))
    server = start_openai_server(engine_proxy, grace=1.0, on_engine_loop=on_engine_loop)
    try:

        async def long_stream() -> int:
            body = {
                "model": "tiny",
                "prompt": "x",
                "max_tokens": 400,
                "ignore_eos": True,
                "stream": True,
            }
            seen = 0
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                try:
                    async with client.stream("POST", "/v1/completions", json=body) as resp:
                        async for line in resp.aiter_lines():
                            if line.startswith("data: "):
                                seen += 1
                                if seen == 2:
                                    threading.Thread(target=server.stop, args=(10,)).start()
                except httpx.HTTPError:
                    pass
            return seen

        seen = asyncio.run(long_stream())
        assert 2 <= seen < 400  # cut short by the bounded drain
    finally:
        server.wait_stopped(15)
        blocking(engine_proxy).collective_rpc("standin_set_step_s", args=(0.0,))
    assert server.wait_stopped(0) and owner.running
    # The cancelled request was aborted in the engine before the stop returned: the
    # front end and the EngineCore hold nothing (no wait for the counts to fall).
    assert owner.run(settled_counts, llm) == (0, 0)


def test_start_refuses_an_engine_without_owner_loop() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    bare = object.__new__(AsyncLLM)  # built outside any loop, owner never recorded
    threads = set(threading.enumerate())
    with pytest.raises(LoopAffinityError, match="bind_owner_loop"):
        start_openai_server(bare, start_timeout=10)
    assert set(threading.enumerate()) <= threads


def test_serve_args_is_a_full_vllm_namespace(engine_proxy: Any) -> None:
    ns = serve_args(engine_proxy, ["--enable-log-requests"])
    assert ns.served_model_name == ["tiny"] and ns.enable_log_requests is True
    assert hasattr(ns, "chat_template") and hasattr(ns, "tool_call_parser")


def test_stop_shuts_the_engine_down_after_the_server(tiny_model: Any) -> None:
    import logging

    from vllm_engines import start_engine

    owner, llm = start_engine(tiny_model, "owned-by-server")
    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    log = logging.getLogger("vllm.v1.engine.async_llm")
    log.addHandler(handler)
    try:
        server = start_openai_server(llm, shutdown_engine=True, grace=1.0)
        seen: list[bool] = []
        original = llm.shutdown

        def shutdown(timeout: float | None = None) -> None:
            seen.append(server.thread.is_alive())  # must already be stopped
            original(timeout)

        llm.shutdown = shutdown
        result = asyncio.run(run_load(server.url, 16, 4, stream_fraction=0.5))
        assert result.ok == 16
        server.stop()
        assert seen == [False]
        assert llm.errored and llm.output_handler.done()
        # The output handler was stopped first: no engine failure was reported.
        assert errors == []
    finally:
        log.removeHandler(handler)
        owner.stop(30)
