"""The library path: the namespace agrees with the engine, and callers add routes.

``serve_args`` takes what the engine fixed from the engine's own config, and
``start_openai_server`` refuses a namespace that says otherwise. RL frameworks
add their own endpoints and middleware to the same threaded app; a route
reaches the engine through the loop-safe proxy.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Request
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from vllm_engines import start_engine, stop_engine

from loopbridge_vllm import ServeArgsMismatch, is_engine_client_proxy, start_openai_server
from loopbridge_vllm.server import _make_parser, check_serve_args, serve_args


def test_serve_args_takes_what_the_engine_fixed(engine_proxy: Any) -> None:
    ns = serve_args(engine_proxy)
    config = engine_proxy.vllm_config
    assert ns.model == str(config.model_config.model) and ns.served_model_name == ["tiny"]
    assert ns.enable_log_requests is engine_proxy.log_requests
    assert ns.disable_log_stats is (not engine_proxy.log_stats)
    assert ns.structured_outputs_config is config.structured_outputs_config
    check_serve_args(engine_proxy, ns)  # agrees


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--served-model-name", "other"], "served_model_name"),
        (["--reasoning-parser", "granite"], "reasoning_parser"),
        (["--enable-log-requests"], "enable_log_requests"),
    ],
)
def test_a_namespace_that_contradicts_the_engine_is_refused(
    engine_proxy: Any, extra: list[str], field: str
) -> None:
    threads = set(threading.enumerate())
    with pytest.raises(ServeArgsMismatch, match=field):
        start_openai_server(engine_proxy, serve_argv=extra, start_timeout=30)
    # A namespace built by hand is checked the same way.
    by_hand = _make_parser().parse_args(["--model", str(engine_proxy.model_config.model), *extra])
    with pytest.raises(ServeArgsMismatch, match=field):
        start_openai_server(engine_proxy, args=by_hand, start_timeout=30)
    assert set(threading.enumerate()) <= threads  # nothing was started


def test_an_engine_with_a_reasoning_parser_is_served_with_it(tiny_model: Path) -> None:
    owner, llm = start_engine(tiny_model, "reasoning-owner", reasoning_parser="granite")
    try:
        server = start_openai_server(llm, grace=1.0)
        try:
            args = server.args
            assert args.structured_outputs_config.reasoning_parser == "granite"
            with httpx.Client(base_url=server.url, timeout=30) as client:
                chat = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "ignore_eos": True,
                }
                assert client.post("/v1/chat/completions", json=chat).status_code == 200
        finally:
            server.stop()
    finally:
        stop_engine(owner, llm)


class _Tag(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers["x-lb-tag"] = "added"
        return response


def test_added_router_and_middleware_are_served_and_reach_the_engine(engine_proxy: Any) -> None:
    seen: dict[str, Any] = {}
    router = APIRouter()

    @router.get("/lb/engine-requests")
    async def engine_requests(request: Request) -> dict[str, Any]:
        engine = request.app.state.engine_client
        seen["proxy"] = is_engine_client_proxy(engine)
        seen["thread"] = threading.current_thread().name
        # Runs on the engine's owner loop through the proxy.
        active = await engine.collective_rpc("standin_active_requests")
        return {"active": active, "tasks": list(await engine.get_supported_tasks())}

    server = start_openai_server(
        engine_proxy, routers=[router], middleware=[Middleware(_Tag)], grace=1.0
    )
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            reply = client.get("/lb/engine-requests")
            assert reply.status_code == 200 and reply.headers["x-lb-tag"] == "added"
            assert reply.json()["active"] == [0] and "generate" in reply.json()["tasks"]
            # vLLM's own routes are still there, under the same middleware.
            models = client.get("/v1/models")
            assert models.status_code == 200 and models.headers["x-lb-tag"] == "added"
    finally:
        server.stop()
    assert seen == {"proxy": True, "thread": server.thread.name}


def test_the_start_error_is_the_one_both_adapters_share() -> None:
    import loopbridge_vllm
    from loopbridge_adapters import ServerStartError
    from loopbridge_vllm import server

    assert loopbridge_vllm.ServerStartError is server.ServerStartError is ServerStartError
    assert server.OpenAIServer._start_error is ServerStartError
