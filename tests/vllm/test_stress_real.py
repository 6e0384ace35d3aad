"""A long mixed run through the proxy: nothing fails, nothing leaks.

2,000 requests over real HTTP: streaming and non-streaming, completions and
chat, with random client disconnects. Completed requests must all be correct;
afterwards the engine holds no requests (front end and EngineCore), the owner
loop holds no extra tasks and no thread was left behind.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest
from vllm_engines import settled_counts
from vllm_load import run_load

from loopbridge import LoopThread
from loopbridge_vllm import engine_client_proxy, start_openai_server

N = int(os.environ.get("LOOPBRIDGE_STRESS_REQUESTS", "2000"))


async def _settled(llm: Any) -> tuple[int, int, int]:
    front, core = await settled_counts(llm)
    return front, core, await _task_count()


async def _task_count() -> int:
    return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])


@pytest.mark.slow
def test_two_thousand_mixed_requests_with_disconnects(
    shared_engine: tuple[LoopThread, Any],
) -> None:
    owner, llm = shared_engine
    server = start_openai_server(engine_client_proxy(llm))
    # Snapshots after a warm-up: lazily started parts (loopbridge's per-loop
    # keeper task, the renderer's worker thread) are not per-request leaks.
    warm = asyncio.run(run_load(server.url, 20, 8, stream_fraction=0.5, chat_fraction=0.5))
    assert warm.failures == []
    tasks_before = owner.run(_task_count)
    threads_before = set(threading.enumerate()) - {server.thread}
    try:
        result = asyncio.run(
            run_load(
                server.url,
                N,
                32,
                stream_fraction=0.5,
                chat_fraction=0.5,
                disconnect_fraction=0.1,
                max_tokens=12,
                seed=7,
            )
        )
    finally:
        server.stop()
    assert result.failures == []
    assert result.attempted == N
    assert result.disconnected > N // 20  # the disconnects really happened
    assert result.ok == N - result.disconnected
    # server.stop() joined the server's thread: every handler has ended, and a
    # cancelled one only once its abort ran on the owner loop.
    front, core, tasks_after = owner.run(_settled, llm)
    assert (front, core) == (0, 0)
    assert tasks_after == tasks_before
    assert set(threading.enumerate()) <= threads_before
    assert not llm.errored
