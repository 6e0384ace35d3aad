"""loopbridge for vLLM: ``AsyncLLM`` owned by one loop, served and driven from anywhere.

* :func:`engine_client_proxy` - an ``EngineClient`` for vLLM's serving layer that
  is safe on any thread or loop.
* :func:`start_openai_server` - vLLM's OpenAI app on its own thread, bound to it.
* :func:`adopt_engine` / :func:`bind_owner_loop` - declare or record the owner
  loop, e.g. at worker initialisation.
* :mod:`loopbridge_vllm.cpu_engine` - the real engine on CPU with a stand-in
  forward pass, for tests and benchmarks.

Importing this package does not import vLLM.
"""

from __future__ import annotations

from loopbridge_adapters.free_threaded import refuse_free_threaded as _refuse_free_threaded
from loopbridge_adapters.public_names import publish as _publish

from .engine import (
    EngineShutDown,
    OffLoopCall,
    UnclassifiedMemberError,
    UnsupportedEngineConfig,
    adopt_engine,
    bind_owner_loop,
    engine_client_proxy,
    is_engine_client_proxy,
    shutdown_engine,
)
from .server import (
    OpenAIServer,
    ServeArgsMismatch,
    ServeOptionError,
    ServerStartError,
    astart_openai_server,
    start_openai_server,
)

__all__ = [
    "EngineShutDown",
    "OffLoopCall",
    "OpenAIServer",
    "ServeArgsMismatch",
    "ServeOptionError",
    "ServerStartError",
    "UnclassifiedMemberError",
    "UnsupportedEngineConfig",
    "adopt_engine",
    "astart_openai_server",
    "bind_owner_loop",
    "engine_client_proxy",
    "is_engine_client_proxy",
    "shutdown_engine",
    "start_openai_server",
]
_publish(__name__, globals())

# Last: what this package holds imports no engine, and on a free-threaded build the
# engine cannot load (loopbridge_adapters.free_threaded).
_refuse_free_threaded(
    "loopbridge_vllm",
    "vLLM",
    "its wheels are cp38-abi3, which a free-threaded interpreter cannot load",
)
