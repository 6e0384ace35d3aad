"""Calls vLLM makes with different arguments in different supported releases.

The CPU stand-in worker (``loopbridge_vllm._standin``) inherits these methods,
so that each of its entry points accepts every supported release's call.
"""

from __future__ import annotations

__all__ = ["WorkerCalls"]


class WorkerCalls:
    """Worker methods whose arguments differ between supported vLLM releases."""

    def set_kv_cache_layout(
        self, layout_name: str, cp_kv_cache_interleave_size: int | None = None
    ) -> None:
        """The KV-cache layout the EngineCore chose (a no-op: no device memory).

        0.33 adds ``cp_kv_cache_interleave_size`` (context-parallel interleave);
        0.32 passes the layout name only.
        """
