"""A request that arrives while generation is paused: what each release does, and
the threaded server's explicit choices (``paused_admission``).

On every tested release and pause mode the request is either answered at once
(refused, with its status) or queued, and a queued one completes after the
resume: none is lost or left hanging. The release's own answer is asserted
against the table docs/vllm.md gives, so a release that changes it fails here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from vllm_engines import unfinished_requests

from loopbridge import blocking, unwrap
from loopbridge_vllm import OpenAIServer, start_openai_server
from loopbridge_vllm._paused_admission import PauseWatch

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release

MODES = ("abort", "wait", "keep")
GUARD_S = 30  # a hang guard, not an expectation


def _release() -> tuple[int, int]:
    import vllm

    major, minor = vllm.__version__.split(".")[:2]
    return int(major), int(minor)


def engine_answer(mode: str) -> str:
    """The release's own answer (docs/vllm.md, "Requests that arrive while paused")."""
    if _release() >= (0, 33) and mode != "keep":
        return "refused"
    return "queued"


@pytest.fixture
def resumed(engine_proxy: Any) -> Iterator[None]:
    yield
    blocking(engine_proxy).resume_generation()  # never leave the shared engine paused


def _start(engine_proxy: Any, policy: str, hold_s: float = 60.0) -> OpenAIServer:
    return start_openai_server(engine_proxy, paused_admission=policy, paused_hold_s=hold_s)


async def _model(client: httpx.AsyncClient, url: str) -> str:
    return str((await client.get(f"{url}/v1/models")).json()["data"][0]["id"])


async def _held(watch: PauseWatch, count: int) -> None:
    """Until the server holds exactly ``count`` requests (woken by the watch itself)."""
    if not await asyncio.to_thread(watch.wait_held, count, GUARD_S):
        raise AssertionError(f"the server never held {count} request(s); it holds {watch.held}")


@pytest.fixture
def admitted(engine_proxy: Any) -> Iterator[threading.Event]:
    """Set when the engine's front end takes a request in (its output processor's
    ``add_request``, on the owner loop): the request is queued in the engine."""
    processor = unwrap(engine_proxy).output_processor
    original = processor.add_request
    event = threading.Event()

    def add_request(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        event.set()
        return result

    processor.add_request = add_request
    yield event
    del processor.add_request


async def _request(client: httpx.AsyncClient, url: str, model: str, stream: bool) -> httpx.Response:
    body = {"model": model, "prompt": "paused", "max_tokens": 4, "stream": stream}
    response = await client.post(f"{url}/v1/completions", json=body, timeout=GUARD_S)
    return response


def _completed(response: httpx.Response) -> bool:
    if response.status_code != 200:
        return False
    if response.text.startswith("data:"):
        return "data: [DONE]" in response.text and '"error"' not in response.text
    return len(response.json()["choices"][0]["text"]) > 0


async def _arrive_while_paused(
    server: OpenAIServer,
    engine_proxy: Any,
    mode: str,
    stream: bool,
    expect: str,
    admitted: threading.Event | None = None,
) -> httpx.Response:
    """Pause, send one request, check it is where ``expect`` says (``answered`` while
    still paused, ``held`` in the server, ``queued`` in the engine); resume; return
    its response."""
    engine = blocking(engine_proxy)
    watch = server.pause_watch
    async with httpx.AsyncClient() as client:
        model = await _model(client, server.url)
        await asyncio.to_thread(engine.pause_generation, mode=mode)
        task = asyncio.ensure_future(_request(client, server.url, model, stream))
        if expect == "answered":
            await asyncio.wait_for(asyncio.shield(task), GUARD_S)  # while still paused
        elif expect == "held":
            assert watch is not None
            await _held(watch, 1)
            assert not task.done() and unfinished_requests(engine_proxy) == 0
        else:
            assert admitted is not None
            if not await asyncio.to_thread(admitted.wait, GUARD_S):
                raise AssertionError("the engine never took the request in")
            assert not task.done()  # in the engine, waiting for the resume
            assert unfinished_requests(engine_proxy) == 1
        await asyncio.to_thread(engine.resume_generation)
        return await task


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("mode", MODES)
def test_the_release_answer_is_the_documented_one(
    engine_proxy: Any,
    shared_server: OpenAIServer,
    resumed: None,
    admitted: threading.Event,
    mode: str,
    stream: bool,
) -> None:
    expected = engine_answer(mode)
    expect = "queued" if expected == "queued" else "answered"
    response = asyncio.run(
        _arrive_while_paused(shared_server, engine_proxy, mode, stream, expect, admitted)
    )
    if expected == "queued":
        assert _completed(response), response.text[:300]
    else:
        # A plain request gets 503; a streamed one has begun: 200, then the error event.
        assert response.status_code == (200 if stream else 503)
        assert "Generation is paused" in response.text and "503" in response.text
    assert unfinished_requests(engine_proxy) == 0


@pytest.fixture(scope="module")
def refusing(engine_proxy: Any) -> Iterator[OpenAIServer]:
    server = _start(engine_proxy, "refuse")
    yield server
    server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("mode", MODES)
def test_refuse_answers_503_before_the_engine_in_every_mode(
    engine_proxy: Any, refusing: OpenAIServer, resumed: None, mode: str, stream: bool
) -> None:
    response = asyncio.run(_arrive_while_paused(refusing, engine_proxy, mode, stream, "answered"))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "ServiceUnavailableError"
    assert unfinished_requests(engine_proxy) == 0

    async def after() -> httpx.Response:  # once resumed, the same server admits
        async with httpx.AsyncClient() as client:
            model = await _model(client, refusing.url)
            return await _request(client, refusing.url, model, stream)

    assert _completed(asyncio.run(after()))


@pytest.fixture(scope="module")
def holding(engine_proxy: Any) -> Iterator[OpenAIServer]:
    server = _start(engine_proxy, "hold")
    yield server
    server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("mode", MODES)
def test_hold_keeps_the_request_out_of_the_engine_until_the_resume(
    engine_proxy: Any, holding: OpenAIServer, resumed: None, mode: str, stream: bool
) -> None:
    response = asyncio.run(_arrive_while_paused(holding, engine_proxy, mode, stream, "held"))
    assert _completed(response), response.text[:300]
    assert holding.pause_watch is not None and holding.pause_watch.held == 0
    assert unfinished_requests(engine_proxy) == 0


def test_hold_refuses_after_its_bound_and_a_leaving_client_leaves_nothing(
    engine_proxy: Any, resumed: None
) -> None:
    server = _start(engine_proxy, "hold", hold_s=0.5)
    engine = blocking(engine_proxy)
    watch = server.pause_watch
    assert watch is not None

    async def main() -> httpx.Response:
        async with httpx.AsyncClient() as client:
            model = await _model(client, server.url)
            await asyncio.to_thread(engine.pause_generation, mode="keep")
            # A client that gives up while held: nothing reaches the engine.
            leaving = asyncio.ensure_future(_request(client, server.url, model, False))
            await _held(watch, 1)
            leaving.cancel()
            await _held(watch, 0)  # the left request is let go
            # One that stays past the bound gets the 503.
            return await _request(client, server.url, model, True)

    try:
        response = asyncio.run(main())
    finally:
        server.stop()
    assert response.status_code == 503
    assert "stayed paused for 0.5 s" in response.json()["error"]["message"]
    assert unfinished_requests(engine_proxy) == 0
    engine.resume_generation()


def test_stopping_the_server_puts_the_engine_members_back(engine_proxy: Any) -> None:
    core = unwrap(engine_proxy).engine_core
    before = set(vars(core))
    server = _start(engine_proxy, "refuse")
    assert "resume_scheduler_async" in vars(core)  # the watch is installed
    server.stop()
    assert set(vars(core)) == before


def test_an_unknown_policy_is_refused_naming_the_choices(engine_proxy: Any) -> None:
    with pytest.raises(ValueError, match="'engine', 'refuse', 'hold'"):
        _start(engine_proxy, "queue")
