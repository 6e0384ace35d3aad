"""Weight-version tags on responses (``weight_version_tags=True``), across a refit.

A trainer thread refits the shared engine with vLLM's native API (pause
``keep``, transfer, ``finish_weight_update(weight_version=...)``, resume)
while a stream and a JSON completion are in flight over HTTP (the official
``openai`` client). Both straddle the refit: their tokens switch from the old
weights to the new ones, and their tags say admitted at the old version,
finished at the new one, mixed. A request after the refit is not mixed. A
server without the option sends neither headers nor the extra chunk.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopbridge import blocking
from loopbridge_vllm import OpenAIServer, start_openai_server

openai = pytest.importorskip("openai")

MAX_TOKENS = 48
OLD, NEW = "wv-old", "wv-new"


def switch(ids: list[int], old: int, new: int) -> int:
    """Where ``ids`` switch from the old weights' tokens to the new ones'
    (the stand-in emits ``base + position % 20``); asserts it switches once."""
    cut = next(g for g, t in enumerate(ids) if t != old + g % 20)
    assert ids == [old + g % 20 for g in range(cut)] + [new + g % 20 for g in range(cut, len(ids))]
    return cut


@pytest.fixture
def engine(engine_proxy: Any) -> Iterator[Any]:
    face = blocking(engine_proxy)
    version = face.get_weight_version()
    face.update_weight_version(OLD)
    face.collective_rpc("standin_set_step_s", args=(0.01,))
    yield face
    face.resume_generation()
    face.collective_rpc("standin_set_step_s", args=(0.0,))
    face.collective_rpc("standin_set_token_base", args=(10,))
    face.update_weight_version(version)


@pytest.fixture
def tagged(engine_proxy: Any) -> Iterator[OpenAIServer]:
    server = start_openai_server(engine_proxy, weight_version_tags=True)
    yield server
    server.stop()


def test_a_refit_straddling_requests_marks_them_mixed(
    engine: Any, engine_proxy: Any, tagged: OpenAIServer, tiny_model: Path
) -> None:
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from loopbridge_vllm.cpu_engine import standin_weights
    from loopbridge_vllm.weight_transfer import inline_update

    # vLLM's own per-token spans (request field return_weight_versions), from 0.33.
    native_spans = "return_weight_versions" in CompletionRequest.model_fields
    extra = {"return_token_ids": True, "ignore_eos": True}
    if native_spans:
        extra["return_weight_versions"] = True
    both_running = threading.Event()
    refitted = threading.Event()
    errors: list[BaseException] = []

    def trainer() -> None:
        try:
            assert both_running.wait(60)
            engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
            engine.pause_generation(mode="keep")
            engine.start_weight_update()
            engine.update_weights(inline_update(standin_weights(tiny_model, 70)))
            engine.finish_weight_update(weight_version=NEW)
            engine.resume_generation()
        except BaseException as exc:
            errors.append(exc)
        finally:
            refitted.set()

    async def json_in_engine() -> None:
        deadline = time.monotonic() + 30
        while True:
            if engine_proxy.get_num_unfinished_requests() >= 2:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the JSON request never reached the engine")
            await asyncio.sleep(0.005)  # the poll interval of a condition

    async def main() -> dict[str, Any]:
        async with openai.AsyncOpenAI(
            base_url=f"{tagged.url}/v1", api_key="unused", max_retries=0, timeout=60
        ) as client:
            raw = await client.completions.with_raw_response.create(
                model="tiny", prompt="tagged", max_tokens=MAX_TOKENS, stream=True, extra_body=extra
            )
            json_reply = asyncio.create_task(
                client.completions.with_raw_response.create(
                    model="tiny", prompt="json", max_tokens=MAX_TOKENS, extra_body=extra
                )
            )
            ids: list[int] = []
            chunks: list[Any] = []
            async for chunk in raw.parse():
                chunks.append(chunk)
                for choice in chunk.choices:
                    ids += list(getattr(choice, "token_ids", None) or [])
                if ids and not both_running.is_set():
                    await json_in_engine()
                    both_running.set()
            reply = await json_reply
            after = await client.chat.completions.with_raw_response.create(
                model="tiny",
                messages=[{"role": "user", "content": "after"}],
                max_tokens=4,
                stream=True,
            )
            after_chunks = [c async for c in after.parse()]
            return {
                "stream_headers": raw.headers,
                "ids": ids,
                "chunks": chunks,
                "json": reply,
                "after_headers": after.headers,
                "after_chunks": after_chunks,
            }

    thread = threading.Thread(target=trainer, name="trainer")
    thread.start()
    try:
        got = asyncio.run(main())
    finally:
        both_running.set()
        thread.join(60)
    assert not errors and refitted.is_set()

    # The stream: admitted at OLD (header), finished at NEW (last chunk), mixed.
    assert got["stream_headers"]["x-weight-version-admitted"] == OLD
    cut = switch(got["ids"], 10, 70)
    assert 0 < cut < MAX_TOKENS
    tag = got["chunks"][-1]
    assert tag.choices == [] and tag.id == got["chunks"][0].id
    assert tag.weight_version == {"admitted": OLD, "finished": NEW, "mixed": True}
    if native_spans:  # vLLM's per-token spans agree on where the switch was
        final = next(c for c in reversed(got["chunks"]) if c.choices and c.choices[0].finish_reason)
        spans = final.choices[0].weight_versions
        assert [(s["version"], s["start"], s["end"]) for s in spans] == [
            (OLD, 0, cut),
            (NEW, cut, MAX_TOKENS),
        ]

    # The JSON reply: all three headers; it straddled the refit too.
    reply = got["json"]
    assert reply.headers["x-weight-version-admitted"] == OLD
    assert reply.headers["x-weight-version-finished"] == NEW
    assert reply.headers["x-weight-version-mixed"] == "true"
    body = reply.parse()
    assert 0 < switch(list(body.choices[0].token_ids), 10, 70) < MAX_TOKENS

    # After the refit: one version, not mixed (a chat stream this time).
    assert got["after_headers"]["x-weight-version-admitted"] == NEW
    last = got["after_chunks"][-1]
    assert last.object == "chat.completion.chunk" and last.choices == []
    assert last.weight_version == {"admitted": NEW, "finished": NEW, "mixed": False}


def test_without_the_option_nothing_is_added(shared_server: OpenAIServer) -> None:
    async def main() -> tuple[Any, list[Any], Any]:
        async with openai.AsyncOpenAI(
            base_url=f"{shared_server.url}/v1", api_key="unused", max_retries=0
        ) as client:
            raw = await client.completions.with_raw_response.create(
                model="tiny", prompt="plain", max_tokens=3, stream=True
            )
            chunks = [c async for c in raw.parse()]
            reply = await client.completions.with_raw_response.create(
                model="tiny", prompt="plain", max_tokens=3
            )
            return raw.headers, chunks, reply.headers

    stream_headers, chunks, json_headers = asyncio.run(main())
    for headers in (stream_headers, json_headers):
        assert not [k for k in headers if k.lower().startswith("x-weight-version")]
    assert all(not hasattr(c, "weight_version") for c in chunks)
    assert chunks[-1].choices  # the last chunk is vLLM's own
