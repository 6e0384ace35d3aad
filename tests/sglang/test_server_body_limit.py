"""Request bodies over the server's limit get a clear 413; smaller ones are served as before.

Stock SGLang reads every body whole, however large: a server with ``max_body_bytes=None``
is that, and the default limit (32 MiB) serves what stock serves in practice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import Manager

from loopbridge import LoopThread
from loopbridge_adapters.body_limit import DEFAULT_MAX_BODY_BYTES
from loopbridge_sglang import SGLangServer, start_sglang_server, tokenizer_manager_proxy

LIMIT = 2**20  # 1 MiB for the small-limit server
PAD = 10 * 10**6  # the bulk of a 10 MB body, in a field SGLang ignores


def _generate(pad: int) -> dict[str, Any]:
    return {
        "input_ids": [1, 5, 7],
        "sampling_params": {"max_new_tokens": 1},
        "unknown_padding": "x" * pad,
    }


def _served(resp: httpx.Response) -> bool:
    return resp.status_code == 200 and resp.json()["meta_info"]["completion_tokens"] == 1


@pytest.fixture
def server(
    request: pytest.FixtureRequest, sgl: Manager, owner: LoopThread
) -> Iterator[SGLangServer]:
    limit = request.param
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with start_sglang_server(p, max_body_bytes=limit, metrics=False) as running:
        yield running


@pytest.mark.parametrize("server", [LIMIT], indirect=True)
def test_body_over_the_limit_is_413_with_the_limit_named(server: SGLangServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        resp = client.post("/generate", json=_generate(PAD))
        assert resp.status_code == 413
        error = resp.json()["error"]
        assert error["code"] == 413 and str(LIMIT) in error["message"]
        # A body within the limit on the same server is served normally.
        assert _served(client.post("/generate", json=_generate(1000)))


@pytest.mark.parametrize("server", [LIMIT], indirect=True)
def test_chunked_body_over_the_limit_is_413(server: SGLangServer) -> None:
    payload = json.dumps(_generate(PAD)).encode()

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    small = json.dumps(_generate(1000)).encode()
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        resp = client.post("/generate", content=chunks(), headers=headers)
        assert resp.status_code == 413
        assert _served(client.post("/generate", content=iter([small]), headers=headers))


@pytest.mark.parametrize(
    "server",
    [DEFAULT_MAX_BODY_BYTES, None],
    ids=["default-limit", "no-limit-as-stock"],
    indirect=True,
)
def test_a_10_mb_body_is_served_as_stock_serves_it(server: SGLangServer) -> None:
    assert PAD < DEFAULT_MAX_BODY_BYTES
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert _served(client.post("/generate", json=_generate(PAD)))


def test_a_limit_below_one_byte_is_refused(sgl: Manager, owner: LoopThread) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with pytest.raises(ValueError, match="max_body_bytes must be positive or None, not 0"):
        SGLangServer(p, max_body_bytes=0)
