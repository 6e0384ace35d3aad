"""The pause-aware DP filter for vLLM's data-parallel engine cores.

* :func:`decide` is the pause-aware message filter; :func:`install_filter`
  (in ``loopbridge_vllm.dp._patch``, imported lazily because it needs vLLM)
  puts it in front of the ``DPEngineCoreProc`` request handler of vLLM 0.32,
  0.33 or 0.34, and ``_plugin.load`` does so from vLLM's plugin loader when
  ``LOOPBRIDGE_DP_FILTER=1``.

The protocol's model and the checker that proves the filter against it are an
instrument, not part of the adapter: :mod:`loopbridge_bench.dp_check` (the
loopbridge-bench distribution). Invariant: this package imports neither, so
every vLLM process that loads the plugin pays for the filter only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._filter import Decision, FilterView, decide

if TYPE_CHECKING:
    from ._patch import install_filter, uninstall_filter

__all__ = [
    "Decision",
    "FilterView",
    "decide",
    "install_filter",
    "uninstall_filter",
]

# What loopbridge_adapters.public_names.publish does for the other packages, by hand:
# importing loopbridge_adapters would cost every vLLM process the threaded server.
for _export in (Decision, FilterView, decide):
    _export.__module__ = __name__


def __getattr__(name: str) -> Any:
    # The patch imports vLLM; keep ``import loopbridge_vllm.dp`` free of it.
    if name in ("install_filter", "uninstall_filter"):
        from . import _patch

        export = getattr(_patch, name)
        export.__module__ = __name__
        return export
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
