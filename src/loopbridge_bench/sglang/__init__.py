"""The latency benchmark against stock SGLang: ``python -m loopbridge_bench.sglang``.

One run serves SGLang's own HTTP app over one real ``TokenizerManager`` and its stand-in
scheduler (:mod:`loopbridge_sglang.cpu_manager`) two ways, interleaved: ``stock`` (the
app on the manager's own loop, the topology of SGLang's ``launch_server``) and
``loopbridge`` (the app on its own thread, the manager through its proxy). A separate
load-generator process sends the same requests over real HTTP to ``/generate``,
streaming and not, at each concurrency, and the report gives the latency percentiles,
the ratios loopbridge / stock and the targets (within 1.05x). The load generator,
statistics and console are :mod:`loopbridge_bench.common`'s, shared with
``python -m loopbridge_bench.vllm``. See ``docs/sglang.md``.
"""

from __future__ import annotations

from ._run import main

__all__ = ["main"]
