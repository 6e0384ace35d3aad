"""The engine-free half of loopbridge's latency benchmarks.

* :mod:`loopbridge_adapters.bench.load` - the HTTP load generator, in a process of its
  own: closed-loop workers or open-loop arrivals, OpenAI's and SGLang's native APIs;
* :mod:`loopbridge_adapters.bench.args` - the load options both benchmarks share
  (requests, concurrency, lengths, streaming, rounds) and their ``--quick`` defaults;
* :mod:`loopbridge_adapters.bench.summary` - percentiles, rows per scenario and mode,
  ratios between modes of one run;
* :mod:`loopbridge_adapters.bench.console` - the report to the terminal, every log to
  a file per phase.

``python -m loopbridge_vllm.bench`` and ``python -m loopbridge_sglang.bench`` are built
on these; neither imports the other.
"""

from __future__ import annotations
