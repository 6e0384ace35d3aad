"""What loopbridge's engine adapters share, and no engine needs.

* :mod:`loopbridge_adapters.surface` - an engine's member table, derived from the
  installed engine and classified by rules, failing closed on a member no rule covers.
* :mod:`loopbridge_adapters.http` - the threaded servers' socket, loop and uvicorn pieces.
* :mod:`loopbridge_adapters.engine_loop` - deprecated: ``EngineLoop`` is
  :class:`loopbridge.LoopThread`.
* :mod:`loopbridge_adapters.threaded` - the threaded servers' lifecycle, one
  ``ServerState`` at a time: ordered start, bounded stop, the owner-loop watchdog,
  ``ServerStartError``; each adapter adds only its engine's part.
* :mod:`loopbridge_adapters.topology` - where a threaded server serves: a thread of its
  own, or the engine's owner loop.
* :mod:`loopbridge_adapters.on_loop` - a function called on a loop the adapters do not
  run, through loopbridge's own crossing.
* :mod:`loopbridge_adapters.owner` - declaring an engine's owner loop and member table
  (an adapter's ``adopt_*`` and ``bind_owner_loop``).
* :mod:`loopbridge_adapters.body_limit` - the threaded servers' cap on request bodies (413).
* :mod:`loopbridge_adapters.exporter` - loopbridge's series on a server's ``/metrics``, and
  the owner loops' lag.
* :mod:`loopbridge_adapters.serve_cli` - an adapter's ``serve`` command line: the table of
  the engine's server options (honoured or refused, failing closed), usage errors.
* :mod:`loopbridge_adapters.serve_lifecycle` - an adapter's ``serve`` command from start
  to exit status: plan, bind, signals, owner loop, build, serve, stop, in one order.

Built on the core's public API only; imports no engine and no adapter. Each adapter
(``loopbridge_vllm``, ``loopbridge_sglang``) imports it; they never import each other.
What both adapters export from here reports this package as its module
(:mod:`loopbridge_adapters.public_names`): ``loopbridge_adapters.ServerStartError``.
"""

from __future__ import annotations

from .http import ExitReason
from .public_names import publish as _publish
from .surface import UnclassifiedMemberError
from .threaded import ServerStartError, ServerState

__all__ = ["ExitReason", "ServerStartError", "ServerState", "UnclassifiedMemberError"]
_publish(__name__, globals())
