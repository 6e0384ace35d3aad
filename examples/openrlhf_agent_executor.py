"""An OpenRLHF agent executor that serves OpenAI HTTP from a thread, through loopbridge.

OpenRLHF's ``RolloutRayActor`` builds vLLM's engine on the Ray actor's event
loop and calls ``AgentExecutor.execute`` there for every rollout. This
executor, in the shape of OpenRLHF's own OpenAI-server example, starts an
OpenAI-compatible app with ``uvicorn`` on a ``threading.Thread`` at the first
``execute``; agents (its ``run_agent``, or tools outside the actor) call it over
HTTP, and its handlers await the actor's ``generate`` (and, for streamed
responses, the engine's) from uvicorn's loop. Without a bridge, that loop waits
on events that the engine's output handler sets from the actor's thread, and
the handler dies with ``deque mutated during iteration``.

The change is the four lines marked ``# loopbridge``: the handlers reach the
actor and its engine through proxies, so that every engine call runs on the
actor's loop. OpenRLHF loads the file as it loads any executor::

    python -m openrlhf.cli.train_ppo_ray ... \\
        --train.agent_func_path examples/openrlhf_agent_executor.py

On CPU, ``tests/vllm/test_openrlhf_server.py`` runs it in OpenRLHF's real
``RolloutRayActor`` (vLLM's engine with loopbridge's stand-in forward pass).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse
from openai import AsyncOpenAI
from openrlhf.utils.agent import AgentExecutorBase
from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

from loopbridge import adopt, proxy  # loopbridge
from loopbridge_vllm import engine_client_proxy  # loopbridge

MODEL_NAME = "policy"


class AgentExecutor(AgentExecutorBase):
    """One OpenAI server per actor, started by the first rollout."""

    def __init__(self) -> None:
        self.base_url: str | None = None
        self._starting = asyncio.Lock()
        self.client: AsyncOpenAI | None = None

    def _init_server(self, llm_engine: Any, hf_tokenizer: Any) -> None:
        """On the actor's loop: bind the server's socket, then serve from a thread."""
        self.llm_engine = proxy(adopt(llm_engine))  # loopbridge
        self.engine = engine_client_proxy(llm_engine.llm)  # loopbridge
        self.hf_tokenizer = hf_tokenizer
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)  # requests queue here until uvicorn accepts them
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self._app(), loop="asyncio", log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="openai-server", daemon=True
        )
        self.thread.start()
        self.client = AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused")

    def _app(self) -> FastAPI:
        app = FastAPI()
        executor = self

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Any:
            body = await request.json()
            prompt_ids, params = executor._parse(body)
            if body.get("stream"):
                params.output_kind = RequestOutputKind.DELTA
                chunks = executor._stream(prompt_ids, params)
                return StreamingResponse(chunks, media_type="text/event-stream")
            # The actor's own generate, awaited from uvicorn's loop.
            output = await executor.llm_engine.generate(prompt_ids, params)
            return _completion(prompt_ids, output.outputs[0])

        return app

    def _parse(self, body: dict[str, Any]) -> tuple[list[int], SamplingParams]:
        messages = body.get("messages") or []
        if not messages:
            raise HTTPException(status_code=400, detail="No messages provided")
        text = self.hf_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        prompt_ids = list(self.hf_tokenizer.encode(text, add_special_tokens=False))
        params = SamplingParams(
            max_tokens=int(body.get("max_tokens") or 16),
            temperature=float(body.get("temperature", 1.0)),
        )
        return prompt_ids, params

    async def _stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[str]:
        """Server-sent events, one per engine output; a disconnect aborts the request."""
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        prompt = TokensPrompt(prompt_token_ids=prompt_ids)
        async for output in self.engine.generate(prompt, params, request_id):
            piece = output.outputs[0]
            choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": piece.text},
                "finish_reason": piece.finish_reason,
                "token_ids": list(piece.token_ids),
            }
            chunk = {"id": request_id, "object": "chat.completion.chunk", "choices": [choice]}
            chunk.update(created=int(time.time()), model=MODEL_NAME)
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    async def execute(
        self,
        prompt: str,
        label: Any,
        sampling_params: SamplingParams,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        """One rollout: a chat completion from this actor's own server."""
        async with self._starting:
            if self.client is None:
                self._init_server(llm_engine, hf_tokenizer)
        assert self.client is not None
        reply = await self.client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=sampling_params.max_tokens,
            temperature=sampling_params.temperature,
        )
        ids = (reply.model_extra or {})["token_ids"]
        observation = ids["prompt_token_ids"] + ids["completion_token_ids"]
        return {
            "prompt": prompt,
            "label": label,
            "observation_tokens": observation,
            "action_ranges": [(len(ids["prompt_token_ids"]), len(observation))],
            "rollout_log_probs": None,
            "truncated": reply.choices[0].finish_reason == "length",
            "reward": None,
            "scores": None,
            "extra_logs": {},
        }


def _completion(prompt_ids: list[int], piece: Any) -> dict[str, Any]:
    """An OpenAI chat completion, with the token ids a trainer needs."""
    completion_ids = list(piece.token_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_NAME,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": piece.text},
                "finish_reason": piece.finish_reason or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion_ids),
            "total_tokens": len(prompt_ids) + len(completion_ids),
        },
        "token_ids": {"prompt_token_ids": prompt_ids, "completion_token_ids": completion_ids},
    }
