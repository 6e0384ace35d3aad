"""Request bodies over the server's limit get a clear 413; smaller ones are served as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loopbridge_adapters.body_limit import DEFAULT_MAX_BODY_BYTES
from loopbridge_vllm import OpenAIServer, start_openai_server

LIMIT = 2**20  # 1 MiB for the small-limit server
PAD = 10 * 10**6  # the bulk of a 10 MB body, in a field vLLM ignores


def _completion(pad: int) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": "Hello",
        "max_tokens": 1,
        "ignore_eos": True,
        "unknown_padding": "x" * pad,
    }


@pytest.fixture
def small_limit_server(engine_proxy: Any) -> Iterator[OpenAIServer]:
    server = start_openai_server(engine_proxy, max_body_bytes=LIMIT, grace=1.0, metrics=False)
    yield server
    server.stop()


def test_body_over_the_limit_is_413_with_the_limit_named(
    small_limit_server: OpenAIServer,
) -> None:
    with httpx.Client(base_url=small_limit_server.url, timeout=60) as client:
        resp = client.post("/v1/completions", json=_completion(PAD))
        assert resp.status_code == 413
        error = resp.json()["error"]
        assert error["code"] == 413 and str(LIMIT) in error["message"]
        # A body within the limit on the same server is served normally.
        ok = client.post("/v1/completions", json=_completion(1000))
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_chunked_body_over_the_limit_is_413(small_limit_server: OpenAIServer) -> None:
    payload = json.dumps(_completion(PAD)).encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    small = json.dumps(_completion(1000)).encode()
    with httpx.Client(base_url=small_limit_server.url, timeout=60) as client:
        resp = client.post(
            "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
        )
        assert resp.status_code == 413
        ok = client.post(
            "/v1/completions", content=iter([small]), headers={"content-type": "application/json"}
        )
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_default_limit_serves_a_10_mb_body_like_stock(shared_server: OpenAIServer) -> None:
    assert PAD < DEFAULT_MAX_BODY_BYTES
    with httpx.Client(base_url=shared_server.url, timeout=60) as client:
        resp = client.post("/v1/completions", json=_completion(PAD))
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 1
