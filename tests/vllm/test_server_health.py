"""``/health`` answers without the owner loop: promptly while it is blocked.

The owner loop is blocked by a callback that waits on an event; "promptly"
means answered while that callback provably still holds the loop (it only
returns once the test releases it, or after ``BLOCK_S``). A marshalled call
sent in the same window shows the loop really is blocked.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from vllm_engines import start_engine

from loopbridge import LoopThread
from loopbridge_vllm import OpenAIServer, engine_client_proxy, shutdown_engine, start_openai_server
from loopbridge_vllm.server import ExitReason

# Longest time the owner loop is held; every check below must finish well
# within it (the test fails, rather than hangs, if one needs the owner loop).
BLOCK_S = 20.0


class OwnerBlock:
    """Holds an owner loop inside one callback until released (or BLOCK_S)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.left = threading.Event()
        loop.call_soon_threadsafe(self._hold)
        assert self.entered.wait(30), "owner loop never ran the blocking callback"

    def _hold(self) -> None:
        self.entered.set()
        self.release.wait(BLOCK_S)
        self.left.set()

    @property
    def holding(self) -> bool:
        return not self.left.is_set()

    def end(self) -> None:
        self.release.set()
        assert self.left.wait(30)


def _marshalled_call_pending(client: Any) -> bool:
    """Whether a round trip to the owner loop is still unanswered after a short wait."""
    done = threading.Event()

    def call() -> None:
        async def ask() -> None:
            # Made in the coroutine: a proxy refuses a call made where no loop runs.
            await client.get_supported_tasks()

        asyncio.run(ask())
        done.set()

    threading.Thread(target=call, daemon=True).start()
    return not done.wait(0.5)


def test_health_answers_while_the_owner_loop_is_blocked(
    shared_engine: tuple[LoopThread, Any], shared_server: OpenAIServer, engine_proxy: Any
) -> None:
    owner, _ = shared_engine
    block = OwnerBlock(owner.loop)
    try:
        with httpx.Client(base_url=shared_server.url, timeout=BLOCK_S * 2) as client:
            assert client.get("/health").status_code == 200
        assert block.holding  # answered before the owner loop was free
        assert _marshalled_call_pending(engine_proxy)  # a round trip would have waited
        assert block.holding
    finally:
        block.end()


@pytest.fixture
def doomed_engine(tiny_model: Path) -> Iterator[tuple[LoopThread, Any, multiprocessing.Process]]:
    """An engine of its own, with its EngineCore process, for a test that kills it."""
    before = set(multiprocessing.active_children())
    owner, llm = start_engine(tiny_model, "doomed-owner")
    core = next(p for p in multiprocessing.active_children() if p not in before)
    try:
        yield owner, llm, core
    finally:
        shutdown_engine(llm)
        owner.stop(30)


def test_health_turns_503_and_server_stops_while_the_owner_loop_is_blocked(
    doomed_engine: tuple[LoopThread, Any, multiprocessing.Process],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, llm, core = doomed_engine
    proxy = engine_client_proxy(llm)
    # Keep the server up after the death first, to see the 503 itself.
    monkeypatch.setenv("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
    server = start_openai_server(proxy, grace=1.0)
    try:
        with httpx.Client(base_url=server.url, timeout=BLOCK_S * 2) as client:
            assert client.get("/health").status_code == 200
            block = OwnerBlock(owner.loop)
            try:
                assert core.pid is not None
                os.kill(core.pid, signal.SIGKILL)
                deadline = time.monotonic() + BLOCK_S / 2
                status = 200
                while status == 200 and time.monotonic() < deadline:
                    status = client.get("/health").status_code
                assert status == 503
                assert block.holding
                # Without the keep-alive switch the watchdog stops the server,
                # still without the owner loop.
                monkeypatch.delenv("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH")
                server.thread.join(BLOCK_S / 2)
                assert not server.thread.is_alive()
                assert server.exit_reason is ExitReason.ENGINE_DIED
                assert block.holding
            finally:
                block.end()
    finally:
        server.stop(10)
