"""The in-process rollout-worker recipe (``examples/rollout_worker.py``).

First the shape it replaces fails, in this run: a raw ``AsyncLLM`` driven by
one ``asyncio.run`` per rollout batch. The first batch's loop takes the
engine's output handler with it, and the second batch gets
``EngineDeadError`` from an engine that is alive. Then the example: batches
on fresh loops, a native weight transfer from a trainer thread while a batch
runs, the new weights in later batches.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_engines import REPO


@pytest.fixture(scope="module")
def recipe() -> Iterator[Any]:
    examples = str(REPO / "examples")
    sys.path.insert(0, examples)
    try:
        yield importlib.import_module("rollout_worker")
    finally:
        sys.path.remove(examples)


def test_a_raw_engine_dies_with_the_first_batch_loop(tiny_model: Path) -> None:
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError

    from loopbridge_vllm.cpu_engine import engine_args

    llm = AsyncLLM.from_engine_args(engine_args(tiny_model))
    params = SamplingParams(max_tokens=3, ignore_eos=True)

    async def batch(engine: Any, rid: str) -> list[int]:
        outs = [o async for o in engine.generate("raw", params, rid)]
        return list(outs[-1].outputs[0].token_ids)

    try:
        assert asyncio.run(batch(llm, "raw-1")) == [10, 11, 12]
        with pytest.raises(EngineDeadError):
            asyncio.run(batch(llm, "raw-2"))  # a new loop: the handler died with the old one
    finally:
        llm.shutdown()
        del llm
        gc.collect()  # now, not at interpreter exit (vLLM's __del__ needs its modules)


def test_the_recipe_survives_new_loops_and_a_trainer_thread(recipe: Any, tiny_model: Path) -> None:
    from loopbridge_vllm.cpu_engine import engine_args, standin_weights

    worker = recipe.RolloutWorker(engine_args(tiny_model))
    try:
        assert worker.generate(["a", "b"], 3) == [[10, 11, 12]] * 2
        assert worker.generate(["c"], 3) == [[10, 11, 12]]  # a second asyncio.run
        # The trainer refits from its thread while a long batch runs; the "wait"
        # pause lets that batch finish on the old weights.
        worker.trainer_face.collective_rpc("standin_set_step_s", args=(0.01,))
        started = threading.Event()
        box: dict[str, Any] = {}

        def trainer() -> None:
            assert started.wait(30)
            box["version"] = worker.update_weights(standin_weights(tiny_model, 60), "step-1")

        thread = threading.Thread(target=trainer)
        thread.start()

        async def long_batch() -> list[list[int]]:
            # The recipe's engine, 4 requests; the trainer starts once each has
            # a token (so each is running in the engine, not just sent).
            from vllm import SamplingParams

            params = SamplingParams(max_tokens=30, ignore_eos=True)
            running = [asyncio.Event() for _ in range(4)]

            async def one(i: int) -> list[int]:
                final: Any = None
                async for out in worker.engine.generate("x", params, f"long-{i}"):
                    running[i].set()
                    final = out
                return list(final.outputs[0].token_ids)

            tasks = [asyncio.ensure_future(one(i)) for i in range(4)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in running)), 30)
            started.set()
            return list(await asyncio.gather(*tasks))

        long = asyncio.run(long_batch())
        thread.join(60)
        assert long == [[10 + g % 20 for g in range(30)]] * 4  # all on the old weights
        assert box["version"] == "step-1"
        worker.trainer_face.collective_rpc("standin_set_step_s", args=(0.0,))
        assert worker.generate(["d"], 3) == [[60, 61, 62]]
        assert worker.engine.get_num_unfinished_requests() == 0
    finally:
        worker.close()
    assert not worker.owner.thread.is_alive()
