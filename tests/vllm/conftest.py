"""Real vLLM on CPU: one tiny model, few engine start-ups, shared by the tests.

Every test here runs the real ``AsyncLLM`` with its spawned EngineCore process
(only the forward pass is faked, see ``loopbridge_vllm.cpu_engine``). Starting
an engine costs 7-15 s, so engines are session-scoped and shared.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_engines import CACHE, REPO, start_engine, stop_engine

from loopbridge import LoopThread
from loopbridge_vllm.cpu_engine import build_tiny_model

# The CPU platform and vLLM's caches are set in tests/conftest.py, before any
# suite imports vLLM.


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return build_tiny_model(CACHE / "tiny-model")


@pytest.fixture(scope="session")
def shared_engine(tiny_model: Path) -> Iterator[tuple[LoopThread, Any]]:
    """The engine most tests share, owned by a loop on its own thread."""
    owner, llm = start_engine(tiny_model, "engine-owner")
    yield owner, llm
    stop_engine(owner, llm)


@pytest.fixture(scope="session")
def engine_proxy(shared_engine: tuple[LoopThread, Any]) -> Any:
    """The shared engine behind ``engine_client_proxy`` (the server's client)."""
    from loopbridge_vllm import engine_client_proxy

    return engine_client_proxy(shared_engine[1])


@pytest.fixture(scope="session")
def shared_server(engine_proxy: Any) -> Iterator[Any]:
    """vLLM's OpenAI app on its own thread, bound to the proxy of the shared engine."""
    from loopbridge_vllm import start_openai_server

    server = start_openai_server(engine_proxy)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def example() -> Iterator[Any]:
    """``examples/ray_actor_server.py``, imported as Ray's workers import it."""
    examples = str(REPO / "examples")
    sys.path.insert(0, examples)
    try:
        yield importlib.import_module("ray_actor_server")
    finally:
        sys.path.remove(examples)


#: What a local Ray cluster's workers need from this process's environment.
_RAY_ENV_KEYS = (
    "LOOPBRIDGE_CPU_PLATFORM",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
    "HF_HUB_OFFLINE",
    "VLLM_CACHE_ROOT",
    "VLLM_RPC_BASE_PATH",
    "TOKENIZERS_PARALLELISM",
)


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """A local 2-CPU Ray cluster for one test module; its ``RAY_ENV`` dict adds
    variables for the workers."""
    ray = pytest.importorskip("ray")
    env = {k: os.environ[k] for k in _RAY_ENV_KEYS if k in os.environ}
    paths = [str(REPO / "examples"), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(getattr(request.module, "RAY_ENV", {}))
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env}
    )
    try:
        yield
    finally:
        ray.shutdown()
