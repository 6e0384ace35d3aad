"""loopbridge's instruments: what measures and checks the adapters, shipped apart from them.

* :mod:`loopbridge_bench.vllm` - the latency benchmark against stock ``vllm serve``
  (``python -m loopbridge_bench.vllm``), with its correctness phase.
* :mod:`loopbridge_bench.sglang` - the latency benchmark against stock SGLang
  (``python -m loopbridge_bench.sglang``).
* :mod:`loopbridge_bench.common` - what both benchmarks share, engine aside: the load
  generator, job records, statistics and the console.
* :mod:`loopbridge_bench.dp_check` - the DP engine-core protocol's model and the checker
  that proves ``loopbridge_vllm.dp``'s filter against it (``python -m
  loopbridge_bench.dp_check``).

The ``loopbridge-bench`` distribution (``bench/pyproject.toml``) ships this package;
the ``loopbridge`` wheel carries none of it. Invariant: no product package
(``loopbridge``, ``loopbridge_adapters``, ``loopbridge_vllm``, ``loopbridge_sglang``)
imports this one (an import-linter contract); it imports them, through their
public API and the few private seams a measurement needs.
"""

from __future__ import annotations
