"""Ray topology: an async actor owns AsyncLLM and serves HTTP from a thread inside it.

Runs the example in ``examples/ray_actor_server.py`` on a local CPU Ray
cluster: the engine is built in the actor's ``__init__``, its owner loop is
recorded in ``post_init`` (the actor's loop), HTTP traffic from the driver and
actor-loop work (rollouts, a native weight transfer) run at the same time, and shutdown
stops the server before the engine.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from vllm_engines import RAY_CALL_GUARD_S, RAY_START_GUARD_S
from vllm_load import run_load

ray = pytest.importorskip("ray")


def test_actor_owns_engine_and_serves_http(
    example: Any, ray_cluster: None, tiny_model: Path
) -> None:
    from loopbridge_vllm.cpu_engine import standin_weights
    from loopbridge_vllm.weight_transfer import inline_update

    worker = example.GenerationWorker.remote(str(tiny_model))
    url = ray.get(worker.post_init.remote(), timeout=RAY_START_GUARD_S)
    assert url.startswith("http://127.0.0.1:")

    # HTTP from the driver while the actor loop runs rollouts and a weight update.
    rollouts = [worker.generate_tokens.remote(f"r{i}", 6) for i in range(4)]
    load = asyncio.run(
        run_load(url, 64, 8, stream_fraction=0.5, chat_fraction=0.5, disconnect_fraction=0.1)
    )
    assert load.failures == [] and load.ok == 64 - load.disconnected
    assert all(len(tokens) == 6 for tokens in ray.get(rollouts, timeout=RAY_CALL_GUARD_S))
    ray.get(worker.init_weight_transfer.remote(), timeout=RAY_CALL_GUARD_S)
    update = inline_update(standin_weights(tiny_model, 70)).update_info
    assert ray.get(worker.refit.remote("keep", update, "v70"), timeout=RAY_CALL_GUARD_S) == "v70"
    assert ray.get(worker.generate_tokens.remote("after", 3), timeout=RAY_CALL_GUARD_S) == [
        70,
        71,
        72,
    ]
    assert ray.get(worker.unfinished_requests.remote(), timeout=RAY_CALL_GUARD_S) == 0

    order = ray.get(worker.shutdown.remote(), timeout=RAY_CALL_GUARD_S)
    assert order == ["server stopped", "engine stopped"]
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    ray.kill(worker)
