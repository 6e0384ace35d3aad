"""HTTP load for the OpenAI server: real requests over loopback with httpx."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

T = TypeVar("T")


@dataclass
class LoadResult:
    ok: int = 0
    disconnected: int = 0
    failures: list[str] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)

    @property
    def attempted(self) -> int:
        return self.ok + self.disconnected + len(self.failures)


async def _one(
    client: httpx.AsyncClient,
    i: int,
    rng: random.Random,
    *,
    stream_fraction: float,
    disconnect_fraction: float,
    chat_fraction: float,
    max_tokens: int,
    result: LoadResult,
) -> None:
    stream = rng.random() < stream_fraction
    disconnect = rng.random() < disconnect_fraction
    chat = rng.random() < chat_fraction
    if chat:
        path = "/v1/chat/completions"
        body: dict[str, object] = {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"hello {i}"}],
        }
    else:
        path = "/v1/completions"
        body = {"model": "tiny", "prompt": f"Hello world {i}"}
    # Chat calls it max_completion_tokens (max_tokens is deprecated there).
    limit = "max_completion_tokens" if chat else "max_tokens"
    body.update({limit: max_tokens}, ignore_eos=True, stream=stream, temperature=0.0)
    try:
        if disconnect:
            # Leave after the first streamed chunk (or after a short wait for a
            # non-streaming reply): the server sees a client disconnect.
            async def leave() -> None:
                async with client.stream("POST", path, json=body) as resp:
                    if stream:
                        async for _ in resp.aiter_lines():
                            break
                    else:
                        await asyncio.sleep(rng.uniform(0.0, 0.02))

            await asyncio.wait_for(leave(), timeout=30)
            result.disconnected += 1
            return
        if not stream:
            resp = await client.post(path, json=body)
            if resp.status_code != 200:
                result.failures.append(f"{resp.status_code}: {resp.text[:300]}")
                return
            usage = resp.json()["usage"]["completion_tokens"]
            if usage != max_tokens:
                result.failures.append(f"wrong token count {usage}")
                return
            result.ok += 1
            result.token_counts.append(usage)
            return
        pieces = 0
        finished = None
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                result.failures.append(f"{resp.status_code}: {text[:300]}")
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    result.failures.append(f"stream error: {str(event)[:300]}")
                    return
                for choice in event.get("choices", []):
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        pieces += 1
                    if choice.get("finish_reason"):
                        finished = choice["finish_reason"]
        if finished != "length":
            result.failures.append(f"stream ended without finish_reason=length ({finished})")
            return
        result.ok += 1
        result.token_counts.append(pieces)
    except (httpx.HTTPError, asyncio.TimeoutError) as exc:
        result.failures.append(f"{type(exc).__name__}: {exc}")


async def run_load(
    url: str,
    n: int,
    concurrency: int,
    *,
    stream_fraction: float = 0.0,
    disconnect_fraction: float = 0.0,
    chat_fraction: float = 0.0,
    max_tokens: int = 8,
    seed: int = 0,
    timeout: float = 60.0,
) -> LoadResult:
    """``n`` requests, at most ``concurrency`` at a time; never raises per request."""
    rng = random.Random(seed)
    result = LoadResult()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:

        async def guarded(i: int) -> None:
            async with sem:
                await _one(
                    client,
                    i,
                    random.Random(rng.random()),
                    stream_fraction=stream_fraction,
                    disconnect_fraction=disconnect_fraction,
                    chat_fraction=chat_fraction,
                    max_tokens=max_tokens,
                    result=result,
                )

        await asyncio.gather(*(guarded(i) for i in range(n)))
    return result


def streams_in_flight(
    n: int,
    stream: Callable[[threading.Semaphore], Awaitable[T]],
    outcomes: list[T],
    bound_s: float,
) -> threading.Thread:
    """``n`` streamed requests, each ``stream(started)``, at once on a client thread of
    their own (its own loop); their outcomes go to ``outcomes`` when all have ended.
    Returns that thread once each request has released ``started`` (its first chunk
    came): the streams are in flight."""
    started = threading.Semaphore(0)

    def clients() -> None:
        async def main() -> None:
            outcomes.extend(await asyncio.gather(*(stream(started) for _ in range(n))))

        asyncio.run(main())

    load = threading.Thread(target=clients, name="stream-clients")
    load.start()
    for _ in range(n):
        assert started.acquire(timeout=bound_s * 4), "a stream never got its first chunk"
    return load
