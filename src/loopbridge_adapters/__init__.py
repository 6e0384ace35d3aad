"""What loopbridge's engine adapters share, and no engine needs.

* :mod:`loopbridge_adapters.surface` - an engine's member table, derived from the
  installed engine and classified by rules, failing closed on a member no rule covers.

Built on the core's public API only; imports no engine and no adapter. Each adapter
(``loopbridge_vllm``, ``loopbridge_sglang``) imports it; they never import each other.
"""

from __future__ import annotations
