"""README's RL-worker quickstart, run as written on the real engine (CPU stand-in).

tests/docs type-checks the block on every lane; here, where vLLM is installed, it
runs: the block is taken from README.md verbatim and executed with ``engine_args``
(the name its snippet marker says the reader already has) set to the tiny model's.
The worker's methods then run on one asyncio loop, as a Ray async actor's would:
the server answers ``/v1/models`` and a streamed completion from another thread's
client, rollouts on the actor's loop use the engine directly, and shutdown in the
documented order leaves no server thread behind.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

import httpx
from vllm_engines import REPO

HEADING = "## Quickstart: an RL worker serving `AsyncLLM`"


def _quickstart() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index(HEADING) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's RL quickstart has no python block"
    return match.group(1)


def _stream(url: str, model: str) -> list[dict[str, Any]]:
    """A streamed completion from a plain thread's client: its events."""
    body = {
        "model": model,
        "prompt": "hi",
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line.removeprefix("data: ")))
    return events


def test_the_readme_worker_serves_rolls_out_and_shuts_down(tiny_model: Path) -> None:
    from vllm import SamplingParams

    from loopbridge_vllm.cpu_engine import engine_args

    namespace: dict[str, Any] = {"engine_args": engine_args(tiny_model)}
    exec(compile(_quickstart(), "README.md", "exec"), namespace)
    threads_before = set(threading.enumerate())

    async def actor() -> tuple[list[dict[str, Any]], str, list[int]]:
        worker = namespace["GenerationWorker"]()
        url = await worker.post_init()
        url = url.replace("0.0.0.0", "127.0.0.1")
        try:
            models = await asyncio.to_thread(httpx.get, f"{url}/v1/models", timeout=60)
            model = models.json()["data"][0]["id"]
            streamed = await asyncio.to_thread(_stream, url, model)
            params = SamplingParams(max_tokens=3, ignore_eos=True)
            outs = [o async for o in worker.llm.generate("rollout", params, "rollout-1")]
        finally:
            await worker.shutdown()
        return streamed, model, list(outs[-1].outputs[0].token_ids)

    streamed, model, tokens = asyncio.run(actor())
    assert streamed[-1]["usage"]["completion_tokens"] == 4  # every token streamed
    assert [e["choices"][0]["finish_reason"] for e in streamed if e["choices"]][-1] == "length"
    assert model == "tiny"  # the served name cpu_engine.engine_args gives the model
    assert tokens == [10, 11, 12]  # the stand-in's tokens, on the actor's own loop
    left = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert [t.name for t in left if "server" in t.name.lower() or "uvicorn" in t.name] == []
