"""The DP engine-core protocol: an executable model, a checker and a filter.

* :func:`check` explores every interleaving of a :class:`Config` of the model
  (variant ``a`` .. ``e``, see :data:`VARIANTS`) and reports deadlocks, hangs
  and lost requests with a shortest counterexample timeline.
* :func:`decide` is the pause-aware message filter; :func:`install_filter`
  (in ``loopbridge_vllm.dp._patch``, imported lazily because it needs vLLM)
  puts it in front of the ``DPEngineCoreProc`` request handler of vLLM 0.32
  or 0.33, and ``_plugin.load`` does so from vLLM's plugin loader when
  ``LOOPBRIDGE_DP_FILTER=1``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._checker import Result, Violation, check
from ._filter import Decision, FilterView, decide
from ._model import VARIANTS, Config, Variant

if TYPE_CHECKING:
    from ._patch import install_filter, uninstall_filter

__all__ = [
    "VARIANTS",
    "Config",
    "Decision",
    "FilterView",
    "Result",
    "Variant",
    "Violation",
    "check",
    "decide",
    "install_filter",
    "uninstall_filter",
]


def __getattr__(name: str) -> Any:
    # The patch imports vLLM; keep ``import loopbridge_vllm.dp`` free of it.
    if name in ("install_filter", "uninstall_filter"):
        from . import _patch

        return getattr(_patch, name)
    raise AttributeError(name)
