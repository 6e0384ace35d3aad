"""loopbridge for SGLang: ``TokenizerManager`` owned by one loop, served and driven from anywhere.

* :func:`tokenizer_manager_proxy` - a ``TokenizerManager`` for SGLang's serving layer
  that is safe on any thread or loop.
* :func:`async_generate` - one generate request, typed by ``stream``.
* :func:`start_sglang_server` - SGLang's own HTTP app on its own thread, bound to it.
* :func:`adopt_manager` / :func:`bind_owner_loop` - declare or record the owner loop.
* :mod:`loopbridge_sglang.cpu_manager` - the real manager on CPU against a stand-in
  scheduler process, for tests and benchmarks.

Importing this package does not import SGLang.
"""

from __future__ import annotations

from loopbridge_adapters.free_threaded import refuse_free_threaded as _refuse_free_threaded
from loopbridge_adapters.public_names import publish as _publish

from .manager import (
    OwnerSideRequest,
    UnclassifiedMemberError,
    adopt_manager,
    async_generate,
    bind_owner_loop,
    is_tokenizer_manager_proxy,
    tokenizer_manager_proxy,
)
from .server import ServerStartError, SGLangServer, start_sglang_server

__all__ = [
    "OwnerSideRequest",
    "SGLangServer",
    "ServerStartError",
    "UnclassifiedMemberError",
    "adopt_manager",
    "async_generate",
    "bind_owner_loop",
    "is_tokenizer_manager_proxy",
    "start_sglang_server",
    "tokenizer_manager_proxy",
]
_publish(__name__, globals())

# Last: what this package holds imports no engine, and on a free-threaded build the
# engine cannot load (loopbridge_adapters.free_threaded).
_refuse_free_threaded(
    "loopbridge_sglang", "SGLang", "its compiled dependencies publish no free-threaded wheels"
)
