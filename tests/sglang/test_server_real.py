"""SGLang's own HTTP app on its own thread, bound to the proxy: lifecycle over real HTTP.

The real manager on its owner loop, SGLang's FastAPI app served by uvicorn on the
server's thread, httpx on loopback as the client.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import httpx
import pytest
from conftest import Crashes, Manager, open_requests_after_barrier
from sglang.srt.managers.io_struct import GenerateReqInput

from loopbridge import LoopThread
from loopbridge_sglang import ServerStartError, async_generate, tokenizer_manager_proxy
from loopbridge_sglang.server import ExitReason, SGLangServer, start_sglang_server


def _generate(url: str, rid: str, tokens: int = 4) -> dict[str, Any]:
    body = {"input_ids": [1, 5, 7], "sampling_params": {"max_new_tokens": tokens}, "rid": rid}
    r = httpx.post(f"{url}/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.parametrize("on_engine_loop", [False, True], ids=["own-thread", "on-engine-loop"])
def test_serves_generate_and_health_then_stops_in_order(
    sgl: Manager, owner: LoopThread, crashes: Crashes, on_engine_loop: bool
) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    server = start_sglang_server(p, on_engine_loop=on_engine_loop)
    try:
        assert server.running
        if on_engine_loop:  # the manager's own loop and thread serve
            assert server.loop is owner.loop and server.thread is owner.thread
        else:  # uvloop is installed with SGLang: the server's loop is uvloop's, as SGLang's
            assert type(server.loop).__module__.startswith("uvloop")
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        out = _generate(server.url, "http-1")
        assert out["output_ids"] == [100, 101, 102, 103]
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
        # Streaming: SGLang's server-sent events, through the proxy's stream.
        body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 3}, "stream": True}
        with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: {")]
        assert json.loads(events[-1][6:])["output_ids"] == [100, 101, 102]

        async def many() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as client:
                bodies = [
                    {"input_ids": [1, i], "sampling_params": {"max_new_tokens": 6}}
                    for i in range(32)
                ]
                rs = await asyncio.gather(
                    *(client.post(f"{server.url}/generate", json=b) for b in bodies)
                )
                return [r.status_code for r in rs]

        assert asyncio.run(many()) == [200] * 32
    finally:
        server.stop()
    assert not server.running and server.wait_stopped(0)
    assert owner.loop.is_running()  # a server on the manager's loop leaves it running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health", timeout=5)
    assert crashes.errors == []
    sgl.scheduler.wait_for("finished")  # the manager itself keeps working
    assert open_requests_after_barrier(owner, sgl.manager) == 0


def test_health_never_waits_for_the_owner_loop(sgl: Manager, owner: LoopThread) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with start_sglang_server(p) as server:
        release = threading.Event()
        blocked = threading.Event()

        def block() -> None:
            blocked.set()
            release.wait(30)

        owner.loop.call_soon_threadsafe(block)
        assert blocked.wait(10)
        try:
            # The owner loop is stuck in a callback; /health still answers at once.
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        finally:
            release.set()


def test_a_busy_port_fails_at_once(sgl: Manager, owner: LoopThread) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        # The address and the fix, as vLLM's server says them; never a bare OSError.
        with pytest.raises(
            ServerStartError, match=f"127.0.0.1:{port}: port {port} is already in use"
        ):
            SGLangServer(p, port=port)
    finally:
        taken.close()


def test_one_sglang_app_per_process(sgl: Manager, owner: LoopThread) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with start_sglang_server(p), pytest.raises(Exception, match="one per process"):
        start_sglang_server(p)


def test_the_server_stops_when_the_owner_loop_dies(sgl: Manager) -> None:
    owner = LoopThread("sglang-owner-dies", loop_factory=asyncio.SelectorEventLoop).start()
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    server = SGLangServer(p, watchdog_interval=0.05).start()
    owner.stop()
    server.thread.join(30)
    assert not server.thread.is_alive()
    assert server.exit_reason is ExitReason.OWNER_LOOP_STOPPED
    server.stop()


def test_the_server_stops_when_handle_loop_dies(
    sgl: Manager, owner: LoopThread, crashes: Crashes
) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    server = SGLangServer(p, watchdog_interval=0.05).start()

    # handle_loop raises on the next reply (a malformed one, say); SGLang would now
    # kill the process (the conftest records it instead).
    def malformed(recv_obj: Any) -> Any:
        raise RuntimeError("malformed reply from the scheduler")

    sgl.manager._handle_batch_output = malformed
    obj = GenerateReqInput(input_ids=[1], sampling_params={"max_new_tokens": 2})
    # Never answered: handle_loop is gone. The owner's shutdown ends it.
    asyncio.run_coroutine_threadsafe(async_generate(p, obj), owner.loop)
    assert crashes.seen.wait(30) and crashes.where == ["handle_loop"]
    server.thread.join(30)
    assert not server.thread.is_alive()
    assert server.exit_reason is ExitReason.ENGINE_DIED
    server.stop()


def test_a_client_that_disconnects_aborts_its_request(paced: Manager, owner: LoopThread) -> None:
    sgl = paced  # 2000 tokens at 2 ms a step: still running when the client hangs up
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with start_sglang_server(p) as server:
        sgl.scheduler.hold()
        body = {
            "input_ids": [1],
            "sampling_params": {"max_new_tokens": 2000},
            "stream": True,
            "rid": "hangs-up",
        }
        with httpx.stream("POST", f"{server.url}/generate", json=body, timeout=30) as r:
            assert r.status_code == 200
            sgl.scheduler.wait_for("received", "hangs-up")
            sgl.scheduler.release()
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
        # The response is closed mid-stream: the client went away.
        sgl.scheduler.wait_for("aborted", "hangs-up")
        assert open_requests_after_barrier(owner, sgl.manager) == 0


def test_api_key_is_checked_by_sglangs_own_middleware(sgl: Manager, owner: LoopThread) -> None:
    # The app is one per process and has served before in this session, so Starlette
    # would take no more middleware: the key check wraps it instead, and still holds.
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with start_sglang_server(p, api_key="sekrit") as server:
        body = {"input_ids": [1], "sampling_params": {"max_new_tokens": 2}}
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        assert httpx.post(f"{server.url}/generate", json=body, timeout=30).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        r = httpx.post(f"{server.url}/generate", json=body, headers=wrong, timeout=30)
        assert r.status_code == 401
        good = {"Authorization": "Bearer sekrit"}
        r = httpx.post(f"{server.url}/generate", json=body, headers=good, timeout=30)
        assert r.status_code == 200 and r.json()["output_ids"] == [100, 101]
    # Without a key the same app answers everyone again.
    with start_sglang_server(p) as server:
        assert httpx.post(f"{server.url}/generate", json=body, timeout=30).status_code == 200


def test_the_start_error_is_the_one_both_adapters_share() -> None:
    import loopbridge_sglang
    from loopbridge_adapters import ServerStartError
    from loopbridge_sglang import server

    assert loopbridge_sglang.ServerStartError is server.ServerStartError is ServerStartError
    assert SGLangServer._start_error is ServerStartError
