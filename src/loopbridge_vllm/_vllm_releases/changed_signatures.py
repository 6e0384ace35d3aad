"""Calls vLLM makes with different arguments in different supported releases.

The CPU stand-in worker (``loopbridge_vllm._standin``) inherits these methods,
so that each of its entry points accepts every supported release's call.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["WorkerCalls", "create_transfer_engine", "transfer_engine_target"]


def create_transfer_engine(
    factory: Any, transfer_config: Any, vllm_config: Any, device: Any, model: Any
) -> Any:
    """``WeightTransferEngineFactory.create_engine`` with the arguments the
    installed release takes: ``(config, vllm_config, device, model)`` from 0.29,
    ``(config, parallel_config, model)`` in 0.24."""
    params = inspect.signature(factory.create_engine).parameters
    if "device" in params:
        return factory.create_engine(transfer_config, vllm_config, device, model)
    return factory.create_engine(transfer_config, vllm_config.parallel_config, model)


def transfer_engine_target(args: tuple[Any, ...]) -> tuple[Any, Any]:
    """``(device, model)`` from what the factory passes a weight-transfer engine
    after its config: ``(vllm_config, device, model)`` from 0.29,
    ``(parallel_config, model)`` in 0.24 (no device: the model's own is used)."""
    if len(args) == 3:
        return args[1], args[2]
    if len(args) == 2:
        model = args[1]
        first = next(iter(model.parameters()), None)
        import torch

        return (first.device if first is not None else torch.device("cpu")), model
    raise TypeError(f"a weight-transfer engine takes 3 or 4 arguments, got {len(args) + 1}")


class WorkerCalls:
    """Worker methods whose arguments differ between supported vLLM releases."""

    def set_kv_cache_layout(
        self, layout_name: str, cp_kv_cache_interleave_size: int | None = None
    ) -> None:
        """The KV-cache layout the EngineCore chose (a no-op: no device memory).

        0.33 adds ``cp_kv_cache_interleave_size`` (context-parallel interleave);
        0.32 passes the layout name only.
        """

    def start_weight_update(self, is_checkpoint_format: bool = True) -> None:
        """Begin a weight update (see the worker's :meth:`_begin_weight_update`).

        0.24 passes ``is_checkpoint_format`` (the stand-in's weights are always
        in checkpoint format); later releases pass nothing.
        """
        self._begin_weight_update()

    def _begin_weight_update(self) -> None:
        raise NotImplementedError
