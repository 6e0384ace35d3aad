"""The cross-loop bug, reproduced with SGLang's real TokenizerManager, and made safe.

Topology of the bug reports (SGLang PRs #5162 and #1606, sglang-jax #628): the manager
started on one loop (its ``handle_loop`` runs there), requests sent from a second loop
on another thread, as an HTTP server thread or an RL framework's actor loop does.
Each request's ``ReqState.event`` is a plain ``asyncio.Event``: the request waits on it
on the caller's loop, ``handle_loop`` sets it on the owner's thread.

The stand-in scheduler is held until every request is parked on its event (the
``req_state_hook`` reports each parked waiter), so the cross-thread ``set()`` is
certain. The caller's loop runs in asyncio debug mode, whose thread check turns that
``set()`` into ``RuntimeError: Non-thread-safe operation invoked on an event loop other
than the current one`` inside ``handle_loop``, which SGLang answers by killing the
process (recorded here instead): the raw run must end that way, with the request
whose wake-up was lost stuck for good. The same run through
``loopbridge_sglang`` must complete every request, with every waiter on the owner
loop and no foreign ``set()``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import Crashes, Manager, ReqStateHook
from sglang.srt.managers.io_struct import GenerateReqInput

from loopbridge import LoopThread
from loopbridge_sglang import async_generate, tokenizer_manager_proxy

N_REQUESTS = 16
TOKENS = 8


def _request(i: int) -> GenerateReqInput:
    return GenerateReqInput(
        input_ids=[1, 5, 7, i], sampling_params={"max_new_tokens": TOKENS}, rid=f"race-{i}"
    )


async def _generate_all(manager: Any) -> list[dict[str, Any]]:
    return list(
        await asyncio.gather(*(async_generate(manager, _request(i)) for i in range(N_REQUESTS)))
    )


def _warm(owner: LoopThread, manager: Any) -> None:
    """One request on the owner loop: handle_loop starts there, as in the reports."""

    async def one() -> dict[str, Any]:
        obj = GenerateReqInput(input_ids=[1], sampling_params={"max_new_tokens": 1})
        return await async_generate(manager, obj)

    assert owner.run(one)["meta_info"]["finish_reason"]["type"] == "length"


def test_raw_manager_shared_with_a_server_thread_dies(
    sgl: Manager,
    owner: LoopThread,
    server_loop: LoopThread,
    req_state_hook: ReqStateHook,
    crashes: Crashes,
) -> None:
    tm = sgl.manager
    _warm(owner, tm)
    assert tm.event_loop is owner.loop
    sgl.scheduler.hold()
    pending = asyncio.run_coroutine_threadsafe(_generate_all(tm), server_loop.loop)
    try:
        req_state_hook.wait_parked(1 + N_REQUESTS)  # the warm-up's waiter, then ours
        assert all(loop is server_loop.loop for loop in req_state_hook.waiter_loops[1:])
        sgl.scheduler.release()
        assert crashes.seen.wait(60), "handle_loop survived a cross-thread ReqState.event.set()"
    finally:
        pending.cancel()
    assert crashes.where == ["handle_loop"]
    (error,) = crashes.errors
    assert isinstance(error, RuntimeError)
    assert "Non-thread-safe operation invoked on an event loop other than the current one" in (
        str(error)
    )
    assert req_state_hook.foreign_sets >= 1
    # handle_loop is gone: the manager answers nobody any more (in SGLang, the
    # process is gone), and the server thread's requests never completed.
    assert not pending.done() or pending.cancelled()
    # The request whose event was set across threads lost its wake-up for good: its
    # task waits on a future that is already done, whose callbacks are gone, so not
    # even cancelling it ends it, and the server thread cannot be stopped.
    stuck = asyncio.run_coroutine_threadsafe(_lost_wakeups(), server_loop.loop).result(10)
    assert stuck >= 1
    with pytest.raises(TimeoutError):
        server_loop.stop(timeout=2)


async def _lost_wakeups() -> int:
    await asyncio.sleep(0)  # whatever was ready has run
    me = asyncio.current_task()
    return sum(
        1
        for task in asyncio.all_tasks()
        if task is not me
        and not task.done()
        and task._fut_waiter is not None  # type: ignore[attr-defined]
        and task._fut_waiter.done()  # type: ignore[attr-defined]
    )


def test_same_run_through_loopbridge_completes(
    sgl: Manager,
    owner: LoopThread,
    server_loop: LoopThread,
    req_state_hook: ReqStateHook,
    crashes: Crashes,
) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    _warm(owner, p)
    sgl.scheduler.hold()
    pending = asyncio.run_coroutine_threadsafe(_generate_all(p), server_loop.loop)
    req_state_hook.wait_parked(1 + N_REQUESTS)
    sgl.scheduler.release()
    outs = pending.result(60)
    assert crashes.errors == []
    assert len(outs) == N_REQUESTS
    for out in outs:
        assert out["output_ids"] == list(range(100, 100 + TOKENS))
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": TOKENS}
    # Every waiter parked on the owner loop, so every set() came from its own thread.
    assert all(loop is owner.loop for loop in req_state_hook.waiter_loops)
    assert req_state_hook.sets >= N_REQUESTS
    assert req_state_hook.foreign_sets == 0
    assert owner.run(_rid_count, sgl.manager) == 0


async def _rid_count(manager: Any) -> int:
    return len(manager.rid_to_state)
