"""An in-process engine driven from a rollout worker's own loop (verl / SkyRL shape).

The rollout worker has a synchronous API that the RL controller calls:
``generate`` for a batch of rollouts, ``update_weights`` from the trainer. Each
rollout batch runs in the worker's own ``asyncio.run``, a fresh loop per call,
and the trainer calls from its own thread. Without loopbridge the engine's
output handler belongs to the first loop that ran it: it is cancelled when
that ``asyncio.run`` returns, and the next batch gets ``EngineDeadError`` from
an engine that is alive. Here the engine lives on its own loop thread and
every caller goes through ``engine_client_proxy``.

Run it on CPU (real vLLM, stand-in forward pass)::

    python examples/rollout_worker.py

On a GPU machine, pass your own ``AsyncEngineArgs`` (with the weight-transfer
backend you use, e.g. ``weight_transfer_config={"backend": "nccl"}``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from typing import Any

from vllm import SamplingParams
from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

from loopbridge import LoopThread, blocking
from loopbridge_vllm import engine_client_proxy, shutdown_engine
from loopbridge_vllm.weight_transfer import inline_update


class RolloutWorker:
    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        self.owner = LoopThread("vllm-owner").start()  # the engine's loop, for its lifetime
        self.llm = AsyncLLM.from_engine_args(engine_args)
        # Any loop or thread may use this; everything runs on the owner loop.
        self.engine = engine_client_proxy(self.llm, loop=self.owner.loop)
        self.trainer_face = blocking(self.engine)  # for plain threads
        self.trainer_face.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))

    def generate(self, prompts: list[str], max_tokens: int) -> list[list[int]]:
        """One rollout batch on the worker's own loop (a new one per call)."""
        return asyncio.run(self._generate(prompts, max_tokens))

    async def _generate(self, prompts: list[str], max_tokens: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)

        async def one(prompt: str) -> list[int]:
            final: Any = None
            async for out in self.engine.generate(prompt, params, f"rollout-{uuid.uuid4().hex}"):
                final = out
            return list(final.outputs[0].token_ids)

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    def update_weights(self, weights: dict[str, Any], version: str) -> str:
        """From the trainer's thread: vLLM's native weight-transfer API."""
        engine = self.trainer_face
        engine.pause_generation(mode="wait")  # let running rollouts finish
        try:
            engine.start_weight_update()
            engine.update_weights(inline_update(weights))
            engine.finish_weight_update(weight_version=version)
        finally:
            engine.resume_generation()
        return str(engine.get_weight_version())

    def close(self) -> None:
        shutdown_engine(self.llm)  # the output handler first, on the owner loop
        self.owner.stop()


def main() -> None:
    from loopbridge_vllm.cpu_engine import (
        build_tiny_model,
        cpu_engine_env,
        engine_args,
        standin_weights,
    )

    cpu_engine_env()
    model = str(build_tiny_model(os.path.join(tempfile.gettempdir(), "loopbridge-tiny-model")))
    worker = RolloutWorker(engine_args(model))
    try:
        print("batch 1:", worker.generate(["a", "b"], 4))
        print("batch 2:", worker.generate(["c"], 4))  # a new loop: still fine
        print("version:", worker.update_weights(standin_weights(model, 60), "step-1"))
        print("batch 3:", worker.generate(["d"], 4))
    finally:
        worker.close()


if __name__ == "__main__":
    main()
