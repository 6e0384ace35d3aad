"""Pause/continue, weight updates and disconnects under streaming load, through the proxy.

Requests stream from a second loop on its own thread (as an HTTP server's), control
calls come from a third thread, the real manager runs on its owner loop. Every request
finishes or is cleanly aborted (an abort finish reason, its state released), and a
caller that goes away aborts its request in the manager.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from conftest import Crashes, Manager, open_requests_after_barrier
from sglang.srt.managers import tokenizer_manager as tm_module
from sglang.srt.managers.io_struct import (
    ContinueGenerationReqInput,
    GenerateReqInput,
    PauseGenerationReqInput,
    UpdateWeightFromDiskReqInput,
)
from starlette.requests import Request

from loopbridge import LoopThread, blocking
from loopbridge_sglang import async_generate, tokenizer_manager_proxy

N_STREAMS = 12
TOKENS = 300  # 0.6 s at the paced stand-in's 2 ms a step: in flight when paused


def _stream_obj(rid: str, tokens: int = TOKENS) -> GenerateReqInput:
    return GenerateReqInput(
        input_ids=[1, 2, 3], sampling_params={"max_new_tokens": tokens}, rid=rid
    )


async def _stream(p: Any, rid: str, first: threading.Semaphore) -> list[dict[str, Any]]:
    outs: list[dict[str, Any]] = []
    async for out in async_generate(p, _stream_obj(rid), stream=True):
        if not outs:
            first.release()
        outs.append(out)
    return outs


def _start_streams(p: Any, server: LoopThread) -> tuple[Any, threading.Semaphore]:
    first = threading.Semaphore(0)

    async def all_streams() -> list[list[dict[str, Any]]]:
        return list(
            await asyncio.gather(*(_stream(p, f"load-{i}", first) for i in range(N_STREAMS)))
        )

    return asyncio.run_coroutine_threadsafe(all_streams(), server.loop), first


def _wait_first_outputs(first: threading.Semaphore) -> None:
    for _ in range(N_STREAMS):
        assert first.acquire(timeout=60)


def test_pause_update_weights_continue_under_streaming_load(
    paced: Manager, owner: LoopThread, server_loop: LoopThread, crashes: Crashes
) -> None:
    p = tokenizer_manager_proxy(paced.manager, loop=owner.loop)
    pending, first = _start_streams(p, server_loop)
    _wait_first_outputs(first)
    # Control calls from this third thread, a plain one: the blocking face, as a
    # trainer thread uses it.
    trainer = blocking(p)
    trainer.pause_generation(PauseGenerationReqInput(mode="in_place"))
    assert paced.scheduler.wait_for("paused") == "in_place"
    assert p.is_pause  # a health read: no owner-loop round trip
    success, message, _ = trainer.update_weights_from_disk(
        UpdateWeightFromDiskReqInput(model_path="/new/weights")
    )
    assert success, message
    assert paced.scheduler.wait_for("weights") == "/new/weights"
    assert not pending.done()  # paused: the streams wait
    trainer.continue_generation(ContinueGenerationReqInput())
    paced.scheduler.wait_for("continued")
    streams = pending.result(60)
    for outs in streams:
        final = outs[-1]
        assert final["meta_info"]["finish_reason"] == {"type": "length", "length": TOKENS}
        assert final["output_ids"] == list(range(100, 100 + TOKENS))
    assert open_requests_after_barrier(owner, paced.manager) == 0
    assert crashes.errors == []


def test_pause_with_abort_ends_every_stream_cleanly(
    paced: Manager, owner: LoopThread, server_loop: LoopThread, crashes: Crashes
) -> None:
    p = tokenizer_manager_proxy(paced.manager, loop=owner.loop)
    pending, first = _start_streams(p, server_loop)
    _wait_first_outputs(first)
    asyncio.run(p.pause_generation(PauseGenerationReqInput(mode="abort")))
    streams = pending.result(60)
    for outs in streams:
        assert outs[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    # Paused: a new request waits until generation continues, then completes.
    later = asyncio.run_coroutine_threadsafe(
        async_generate(p, _stream_obj("after-pause", 3)), server_loop.loop
    )
    asyncio.run(p.continue_generation(ContinueGenerationReqInput()))
    assert later.result(60)["output_ids"] == [100, 101, 102]
    assert open_requests_after_barrier(owner, paced.manager) == 0
    assert crashes.errors == []


def test_weight_update_under_load_waits_for_the_running_requests(
    paced: Manager, owner: LoopThread, server_loop: LoopThread, crashes: Crashes
) -> None:
    p = tokenizer_manager_proxy(paced.manager, loop=owner.loop)
    pending, first = _start_streams(p, server_loop)
    _wait_first_outputs(first)
    # Not paused: the update takes the model-update writer lock, which waits for the
    # requests holding its reader side (all of them) to finish.
    success, _, _ = asyncio.run(
        p.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path="/w2"))
    )
    assert success
    # The stand-in saw every request finish before the update reached it: events
    # reported before "weights" are buffered by wait_for, so timeout=0 finds them
    # there and would fail for one reported after.
    assert paced.scheduler.wait_for("weights") == "/w2"
    for i in range(N_STREAMS):
        paced.scheduler.wait_for("finished", f"load-{i}", timeout=0)
    for outs in pending.result(60):
        assert outs[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert crashes.errors == []


def test_closing_a_stream_aborts_the_request_in_the_manager(
    paced: Manager, owner: LoopThread, server_loop: LoopThread
) -> None:
    sgl = paced  # 2000 tokens at 2 ms a step: still running when the client leaves
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    sgl.scheduler.hold()

    async def read_one_then_leave() -> dict[str, Any]:
        obj = _stream_obj("leaves", 2000)
        obj.stream = True
        agen = p.generate_request(obj)
        task = asyncio.ensure_future(agen.__anext__())
        await asyncio.wrap_future(
            asyncio.get_running_loop().run_in_executor(
                None, sgl.scheduler.wait_for, "received", "leaves"
            )
        )
        sgl.scheduler.release()
        out = await task
        await agen.aclose()  # the client went away
        return out

    asyncio.run_coroutine_threadsafe(read_one_then_leave(), server_loop.loop).result(60)
    sgl.scheduler.wait_for("aborted", "leaves")
    assert open_requests_after_barrier(owner, sgl.manager) == 0


def test_cancelling_a_caller_aborts_its_request(
    sgl: Manager, owner: LoopThread, server_loop: LoopThread
) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    sgl.scheduler.hold()
    task_box: list[asyncio.Task[Any]] = []

    async def start() -> None:
        task_box.append(asyncio.ensure_future(async_generate(p, _stream_obj("cancelled"))))

    asyncio.run_coroutine_threadsafe(start(), server_loop.loop).result(10)
    sgl.scheduler.wait_for("received", "cancelled")
    server_loop.loop.call_soon_threadsafe(task_box[0].cancel)
    sgl.scheduler.wait_for("aborted", "cancelled")
    sgl.scheduler.release()
    assert open_requests_after_barrier(owner, sgl.manager) == 0


def test_an_http_disconnect_is_seen_on_the_server_loop_and_aborts(
    sgl: Manager, owner: LoopThread, server_loop: LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's own disconnect check works through the proxy: a request that gets no
    output for ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT`` asks ``request.is_disconnected()``;
    the question runs on the loop that owns the connection, and the manager aborts the
    request."""
    # The scheduler is held, so the request waits; shorten SGLang's poll interval.
    monkeypatch.setattr(tm_module, "_REQUEST_STATE_WAIT_TIMEOUT", 0.05)
    sgl.scheduler.hold()
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    receive_threads: list[str] = []

    async def receive() -> dict[str, Any]:
        receive_threads.append(threading.current_thread().name)
        return {"type": "http.disconnect"}

    async def generate() -> Any:
        request = Request({"type": "http", "method": "POST", "headers": []}, receive)
        obj = _stream_obj("gone", 50)
        agen = p.generate_request(obj, request)
        try:
            return await agen.__anext__()
        finally:
            await agen.aclose()

    pending = asyncio.run_coroutine_threadsafe(generate(), server_loop.loop)
    with pytest.raises(ValueError, match="disconnected from the client side"):
        pending.result(60)
    sgl.scheduler.wait_for("aborted", "gone")
    sgl.scheduler.release()
    assert receive_threads and set(receive_threads) == {"sglang-server"}
    assert open_requests_after_barrier(owner, sgl.manager) == 0
