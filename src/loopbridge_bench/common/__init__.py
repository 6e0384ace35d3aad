"""The engine-free half of loopbridge's latency benchmarks.

* :mod:`loopbridge_bench.common.load` - the HTTP load generator, in a process of its
  own: closed-loop workers or open-loop arrivals, OpenAI's and SGLang's native APIs;
* :mod:`loopbridge_bench.common.args` - the load options both benchmarks share
  (requests, concurrency, lengths, streaming, rounds) and their ``--quick`` defaults;
* :mod:`loopbridge_bench.common.summary` - percentiles, rows per scenario and mode,
  ratios between modes of one run;
* :mod:`loopbridge_bench.common.console` - the report to the terminal, every log to
  a file per phase.

``python -m loopbridge_bench.vllm`` and ``python -m loopbridge_bench.sglang`` are built
on these; neither imports the other.
"""

from __future__ import annotations
