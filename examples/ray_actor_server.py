"""A Ray async actor owns vLLM's AsyncLLM and serves the OpenAI API from a thread.

This is how RL frameworks run generation: the actor's event loop owns the
engine (Ray calls, weight updates and rollouts run there), while an
OpenAI-compatible HTTP server runs on a thread inside the same actor for agents
and environments. ``loopbridge_vllm`` keeps the server thread away from the
engine's asyncio state.

Run it on CPU (real vLLM, stand-in forward pass), with Ray installed
(``pip install ".[ray]"``, beside vLLM)::

    python examples/ray_actor_server.py

The trainer's side is vLLM's native weight-transfer API (``pause``,
``push_weights``, ``resume``), called on the actor's loop. On CPU the engine
uses loopbridge's ``loopbridge_inline`` backend, which carries the tensors in
the update request. On a GPU machine, build the engine from your own
``AsyncEngineArgs`` (with ``weight_transfer_config={"backend": "nccl"}`` and
NCCL's ``init_info``) instead of ``cpu_engine.engine_args``.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import ray


@ray.remote(num_cpus=1)
class GenerationWorker:
    def __init__(self, model_dir: str) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        from loopbridge_vllm import adopt_engine
        from loopbridge_vllm.cpu_engine import engine_args

        # Built in __init__, possibly before the actor's loop runs anything.
        self.llm = AsyncLLM.from_engine_args(engine_args(model_dir))
        adopt_engine(self.llm)  # declares the member table; the loop comes next
        self.server: Any = None

    async def post_init(self) -> str:
        """Record the actor's loop as the engine's owner, then serve HTTP."""
        from loopbridge_vllm import astart_openai_server, bind_owner_loop

        bind_owner_loop(self.llm)  # the running loop: Ray's actor loop
        self.server = await astart_openai_server(self.llm, port=0)
        return str(self.server.url)

    async def generate_tokens(self, prompt: str, max_tokens: int) -> list[int]:
        """A rollout on the owner loop itself: the engine is used directly."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        final = None
        async for out in self.llm.generate(prompt, params, f"ray-{uuid.uuid4().hex}"):
            final = out
        assert final is not None
        return list(final.outputs[0].token_ids)

    # -- the trainer's side: vLLM's native RL API, on the owner loop ------------
    async def init_weight_transfer(self) -> None:
        """Once, before the first update: connect the workers' transfer backend."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))

    async def pause(self, mode: str) -> None:
        """``keep`` freezes requests in flight, ``abort`` ends them, ``wait`` lets
        them finish; new requests queue (keep) or are refused (abort, wait)."""
        await self.llm.pause_generation(mode=mode)

    async def push_weights(self, update_info: dict[str, Any], version: str) -> str:
        """One weight transfer; the engine is paused. Returns the new version."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        await self.llm.start_weight_update()
        await self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))
        await self.llm.finish_weight_update(weight_version=version)
        return str(await self.llm.get_weight_version())

    async def resume(self) -> None:
        await self.llm.resume_generation()

    async def refit(self, mode: str, update_info: dict[str, Any], version: str) -> str:
        """Pause, transfer and resume in one call."""
        await self.pause(mode)
        try:
            return await self.push_weights(update_info, version)
        finally:
            await self.resume()

    async def unfinished_requests(self) -> int:
        return int(self.llm.get_num_unfinished_requests())

    async def shutdown(self) -> list[str]:
        """Stop HTTP first (without blocking the actor loop), then the engine."""
        from loopbridge_vllm import shutdown_engine

        order: list[str] = []
        if self.server is not None:
            await self.server.aclose()
            # wait_stopped() holds in either topology (with on_engine_loop=True the
            # server's thread is the engine's, which runs on): True once serving ended.
            order.append("server stopped" if self.server.wait_stopped(0) else "server alive")
        shutdown_engine(self.llm)  # on the owner loop: cancels the handler first
        order.append("engine stopped")
        return order


def main() -> None:
    import httpx

    from loopbridge_vllm.cpu_engine import build_tiny_model, cpu_engine_env, standin_weights
    from loopbridge_vllm.weight_transfer import inline_update

    env = cpu_engine_env()
    model = str(build_tiny_model(os.path.join(tempfile.gettempdir(), "loopbridge-tiny-model")))
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env})
    try:
        worker = GenerationWorker.remote(model)  # type: ignore[attr-defined]
        url = ray.get(worker.post_init.remote())
        print("serving on", url)
        reply = httpx.post(
            f"{url}/v1/completions",
            json={"model": "tiny", "prompt": "Hello", "max_tokens": 5},
            timeout=30,
        ).json()
        print("HTTP completion:", reply["choices"][0]["text"])
        print("rollout on the actor loop:", ray.get(worker.generate_tokens.remote("hi", 4)))
        # The trainer: new weights for the stand-in (its tokens are their arg-max).
        ray.get(worker.init_weight_transfer.remote())
        update = inline_update(standin_weights(model, 50)).update_info
        print("weight version:", ray.get(worker.refit.remote("keep", update, "step-1")))
        print("after update:", ray.get(worker.generate_tokens.remote("hi", 4)))
        print("shutdown:", ray.get(worker.shutdown.remote()))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
