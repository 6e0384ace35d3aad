"""The downstream design, re-created for comparison: one hop per streamed output.

This is how a hand-written fix typically makes ``AsyncLLM`` usable from an HTTP
thread: a wrapper with an explicit, hand-listed surface; every owner-loop
operation is one ``asyncio.run_coroutine_threadsafe`` (a Task on the owner loop
plus a ``concurrent.futures.Future``) awaited through ``asyncio.wrap_future``;
``generate`` pulls each output with its own round trip, so every output waits
for the owner loop to schedule it.  Setup data and status are read directly.

It exists only as the ``per-hop`` baseline of the latency benchmark.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["PerHopClient"]

_log = logging.getLogger(__name__)
R = TypeVar("R")


class PerHopClient:
    """A hand-listed engine client: each owner-loop operation is one marshalled hop."""

    def __init__(self, engine: Any, engine_loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self._loop = engine_loop
        # Setup data, copied once and used from the HTTP thread.
        self.model_config = engine.model_config
        self.vllm_config = engine.vllm_config
        self.renderer = engine.renderer
        self.input_processor = engine.input_processor

    async def _on_engine_loop(self, operation: Callable[[], Awaitable[R]]) -> R:
        if asyncio.get_running_loop() is self._loop:
            return await operation()

        async def run() -> R:
            return await operation()

        future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    # -- status: read directly (a property cannot await a hop) -----------------
    @property
    def errored(self) -> bool:
        return bool(self._engine.errored)

    @property
    def dead_error(self) -> BaseException:
        return self._engine.dead_error  # type: ignore[no-any-return]

    @property
    def is_running(self) -> bool:
        return bool(self._engine.is_running)

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        # Called by the serving layer before every response; added by hand
        # when vLLM started calling it (a plain count read).
        self._engine.check_admission(n, request_id)

    async def is_tracing_enabled(self) -> bool:
        return bool(await self._engine.is_tracing_enabled())

    # -- marshalled ---------------------------------------------------------------
    async def get_supported_tasks(self) -> Any:
        return await self._on_engine_loop(self._engine.get_supported_tasks)

    async def do_log_stats(self) -> None:
        await self._on_engine_loop(self._engine.do_log_stats)

    async def abort(self, request_id: Any, internal: bool = False) -> None:
        engine = self._engine
        await self._on_engine_loop(lambda: engine.abort(request_id, internal))

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        return self._generate(prompt, sampling_params, request_id, kwargs)

    async def _generate(
        self, prompt: Any, sampling_params: Any, request_id: str, kwargs: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        iterator: Any = None
        completed = False

        async def next_output() -> Any:
            nonlocal iterator
            if iterator is None:
                # Created on the owner loop, so the request's collector lives there.
                iterator = self._engine.generate(prompt, sampling_params, request_id, **kwargs)
            return await iterator.__anext__()

        try:
            while True:
                try:
                    output = await self._on_engine_loop(next_output)
                except StopAsyncIteration:
                    completed = True
                    return
                yield output
        finally:
            if not completed:
                try:
                    await self._on_engine_loop(lambda: self._engine.abort(request_id))
                except Exception:
                    _log.exception("abort of %s failed", request_id)
