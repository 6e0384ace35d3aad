"""loopbridge for vLLM: ``AsyncLLM`` owned by one loop, served and driven from anywhere.

* :func:`engine_client_proxy` - an ``EngineClient`` for vLLM's serving layer that
  is safe on any thread or loop.
* :func:`start_openai_server` - vLLM's OpenAI app on its own thread, bound to it.
* :func:`adopt_engine` / :func:`bind_owner_loop` - declare or record the owner
  loop, e.g. at worker initialisation.
* :mod:`loopbridge_vllm.cpu_engine` - the real engine on CPU with a stand-in
  forward pass, for tests and benchmarks.

Importing this package does not import vLLM, nor loopbridge itself: the names below
load with their modules on first use. vLLM imports this package in each of its
processes for the two plugins it registers (``loopbridge_vllm._cpu_platform``,
``loopbridge_vllm.dp._plugin``), opted in or not; those pay for themselves only
(tests/test_plugin_imports.py).
"""

from __future__ import annotations

import sysconfig
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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


def _load() -> None:
    """Import the modules that define ``__all__`` and publish it, once: every name
    arrives at the same time, so what reprs and tracebacks say never depends on which
    name was asked for first."""
    from loopbridge_adapters.public_names import publish

    from . import engine, server

    namespace = globals()
    for name in __all__:
        namespace[name] = getattr(engine, name, None) or getattr(server, name)
    publish(__name__, namespace)


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# vLLM cannot load on a free-threaded build (loopbridge_adapters.free_threaded): say so
# at once, in one line. A standard build imports nothing more here.
if sysconfig.get_config_var("Py_GIL_DISABLED"):
    from loopbridge_adapters.free_threaded import refuse_free_threaded

    refuse_free_threaded(
        "loopbridge_vllm",
        "vLLM",
        "its wheels are cp38-abi3, which a free-threaded interpreter cannot load",
    )
