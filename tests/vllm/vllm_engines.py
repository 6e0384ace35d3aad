"""Engine start-up helpers shared by the vLLM tests (no fixtures here)."""

from __future__ import annotations

import asyncio
import gc
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"


class OwnerThread:
    """A thread running an event loop: the engine's owner, as a Ray actor's would be."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Any, timeout: float = 120.0) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def stop(self) -> None:
        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.get_running_loop().shutdown_asyncgens()

        if self._thread.is_alive():
            self.run(cancel_rest(), timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        if not self._thread.is_alive():
            self.loop.close()

    @property
    def thread(self) -> threading.Thread:
        return self._thread


def start_engine(model: Path, name: str, **overrides: Any) -> tuple[OwnerThread, Any]:
    """An ``AsyncLLM`` created on (and so owned by) a fresh loop thread."""
    from loopbridge_vllm.cpu_engine import make_async_llm

    owner = OwnerThread(name)
    llm = owner.run(make_async_llm(model, **overrides))
    return owner, llm


def stop_engine(owner: OwnerThread, llm: Any) -> None:
    llm.shutdown()
    owner.stop()
    gc.collect()
