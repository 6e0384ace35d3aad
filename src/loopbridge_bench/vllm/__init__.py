"""The latency benchmark: ``python -m loopbridge_bench.vllm``.

It starts vLLM's OpenAI server on its own thread over a real ``AsyncLLM`` owned
by another loop, drives it over real HTTP from a separate load-generator
process, and compares the ways for the HTTP thread to reach the engine, in
interleaved rounds: ``unsafe`` (the raw engine), ``per-hop`` (one
``run_coroutine_threadsafe`` hop per streamed output, as a hand-written fix
does) and ``loopbridge``, all against ``stock``: vLLM's own ``vllm serve``
process over the same engine configuration.  Before the latency rounds, a
short correctness phase runs the race amplifier (:class:`CollectorSetHold`)
against the raw engine and against loopbridge, on an engine of its own.  See
``docs/performance.md`` for the method.
"""

from __future__ import annotations

from ._amplifier import CollectorSetHold
from ._run import main

__all__ = ["CollectorSetHold", "main"]
