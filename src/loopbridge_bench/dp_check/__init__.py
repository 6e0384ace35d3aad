"""The DP engine-core protocol's model and its checker: ``python -m loopbridge_bench.dp_check``.

* :func:`check` explores every interleaving of a :class:`Config` of the model
  (variant ``a`` .. ``e``, see :data:`VARIANTS`) and reports deadlocks, hangs
  and lost requests with a shortest counterexample timeline.
* The filtered variants (``e``, ``e33``) run the adapter's pause-aware filter itself
  (:func:`loopbridge_vllm.dp.decide`): the filter vLLM's engine cores run is the one
  checked here, and only the filter and its plugin ship with the adapter.
"""

from __future__ import annotations

from ._checker import Result, Violation, check
from ._model import VARIANTS, Config, Variant

__all__ = ["VARIANTS", "Config", "Result", "Variant", "Violation", "check"]
