"""Engine start-up helpers shared by the vLLM tests (no fixtures here)."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

from loopbridge import LoopThread

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"


async def settled_counts(llm: Any) -> tuple[int, int]:
    """(front-end unfinished, EngineCore-side active) requests, polled on the
    owner loop until both reach zero or a deadline passes."""
    deadline = time.monotonic() + 20
    while True:
        front = llm.get_num_unfinished_requests()
        core = (await llm.collective_rpc("standin_active_requests"))[0]
        if (front == 0 and core == 0) or time.monotonic() > deadline:
            return front, core
        await asyncio.sleep(0.05)  # the poll interval


def start_engine(model: Path, name: str, **overrides: Any) -> tuple[LoopThread, Any]:
    """An ``AsyncLLM`` created on (and so owned by) a fresh loop thread."""
    from loopbridge_vllm.cpu_engine import make_async_llm

    owner = LoopThread(name).start()
    try:
        llm = owner.run(lambda: make_async_llm(model, **overrides))
    except BaseException:
        owner.stop()
        raise
    return owner, llm


def stop_engine(owner: LoopThread, llm: Any) -> None:
    from loopbridge_vllm import shutdown_engine

    shutdown_engine(llm)
    owner.stop(30)
    gc.collect()
