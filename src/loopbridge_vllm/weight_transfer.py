"""A weight-transfer backend for vLLM's native RL API that needs no CUDA.

vLLM's native weight-transfer API (``init_weight_transfer_engine``,
``start_weight_update``, ``update_weights``, ``finish_weight_update``,
``shutdown_weight_transfer_engine``) hands every call to a backend on each
worker, chosen by ``weight_transfer_config={"backend": NAME}`` and looked up
in vLLM's ``WeightTransferEngineFactory``. The built-in backends move tensors
over NCCL or CUDA IPC; :data:`INLINE_BACKEND` carries them *in the update
request itself*: each tensor's bytes, dtype and shape travel through the same
RPC as the call (plain bytes, which vLLM's msgpack encoding and Ray's pickling
both keep as they are), and the worker loads them with the model's own
``load_weights``. That works on a CPU worker, and from a trainer that has no
process group with the engine.

Invariants:

* A chunk is checked whole before any of it is loaded: every name is a
  parameter of the model, and each tensor has that parameter's shape and
  dtype. A bad chunk raises :class:`ValueError` naming the parameter, and the
  model keeps its previous weights.
* Registration is idempotent per process: :func:`register_inline_backend` can
  run in the front end, the EngineCore and the workers alike.

The CPU stand-in worker (:mod:`loopbridge_vllm.cpu_engine`) registers and uses
it; the trainer side is :func:`inline_update`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
    WeightTransferUpdateRequest,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from loopbridge_vllm._vllm_releases.changed_signatures import transfer_engine_target

if TYPE_CHECKING:
    from vllm.config.weight_transfer import WeightTransferConfig

__all__ = [
    "INLINE_BACKEND",
    "InlineInitInfo",
    "InlineUpdateInfo",
    "InlineWeightTransferEngine",
    "inline_update",
    "register_inline_backend",
]

#: The backend name for ``weight_transfer_config={"backend": INLINE_BACKEND}``.
INLINE_BACKEND = "loopbridge_inline"


@dataclass
class InlineInitInfo(WeightTransferInitInfo):
    """``init_weight_transfer_engine``'s ``init_info``: nothing to connect to."""


@dataclass
class InlineUpdateInfo(WeightTransferUpdateInfo):
    """One chunk: parallel lists, one entry per full parameter (as NCCL's)."""

    names: list[str] = field(default_factory=list)
    dtype_names: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The chunk's ``(name, tensor)`` pairs; :class:`ValueError` if malformed."""
        counts = {len(self.names), len(self.dtype_names), len(self.shapes), len(self.data)}
        if len(counts) != 1:
            raise ValueError(
                "update_weights: names, dtype_names, shapes and data must have one "
                f"entry per parameter (got {len(self.names)}, {len(self.dtype_names)}, "
                f"{len(self.shapes)}, {len(self.data)})"
            )
        out = []
        for name, dtype_name, shape, raw in zip(
            self.names, self.dtype_names, self.shapes, self.data
        ):
            dtype = getattr(torch, str(dtype_name), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"update_weights: {name!r} has no torch dtype {dtype_name!r}")
            size = dtype.itemsize
            for dim in shape:
                size *= int(dim)
            if len(raw) != size:
                raise ValueError(
                    f"update_weights: {name!r} carries {len(raw)} bytes; "
                    f"{dtype_name} {list(shape)} needs {size}"
                )
            if not raw:  # torch.frombuffer refuses an empty buffer
                out.append((str(name), torch.empty(shape, dtype=dtype)))
                continue
            flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            out.append((str(name), flat.view(dtype).reshape(shape)))
        return out


class InlineWeightTransferEngine(WeightTransferEngine[InlineInitInfo, InlineUpdateInfo]):
    """The worker side: load the tensors an update request carries."""

    init_info_cls = InlineInitInfo
    update_info_cls = InlineUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: WeightTransferConfig, *args: Any) -> None:
        # (vllm_config, device, model) from vLLM 0.29; (parallel_config, model) in 0.24.
        super().__init__(config, *args)
        self.device, self.model = transfer_engine_target(args)
        self.initialized = False
        #: Parameters loaded since the engine started (a count per name).
        self.loaded: dict[str, int] = {}

    def init_transfer_engine(self, init_info: InlineInitInfo) -> None:
        self.initialized = True

    def start_weight_update(self) -> None:
        self._check_initialized("start_weight_update")

    def finish_weight_update(self) -> None:
        self._check_initialized("finish_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class synchronises the accelerator afterwards, which
        # raises on a machine without one; a CPU copy is done when it returns.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu" and torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: InlineUpdateInfo) -> None:
        self._check_initialized("update_weights")
        params = dict(self.model.named_parameters())
        chunk = update_info.tensors()
        for name, tensor in chunk:
            param = params.get(name)
            if param is None:
                known = ", ".join(sorted(params)[:8])
                raise ValueError(
                    f"update_weights: the model has no parameter {name!r} (it has: {known}...)"
                )
            if tuple(tensor.shape) != tuple(param.shape) or tensor.dtype != param.dtype:
                raise ValueError(
                    f"update_weights: {name!r} is {tuple(tensor.shape)} {tensor.dtype}; "
                    f"the model's parameter is {tuple(param.shape)} {param.dtype}"
                )
        load = getattr(self.model, "load_weights", None)
        if load is None:
            raise ValueError(f"{type(self.model).__name__} has no load_weights() to load into")
        load(chunk)
        for name, _ in chunk:
            self.loaded[name] = self.loaded.get(name, 0) + 1

    def shutdown(self) -> None:
        self.initialized = False

    @staticmethod
    def trainer_send_weights(*args: Any, **kwargs: Any) -> None:
        """The trainer side is :func:`inline_update`: no transport to send over.

        (0.24 declares it abstract on every backend.)"""
        raise NotImplementedError(
            f"the {INLINE_BACKEND} backend has no trainer transport: build the update "
            "request with loopbridge_vllm.weight_transfer.inline_update() instead"
        )

    def _check_initialized(self, call: str) -> None:
        if not self.initialized:
            raise RuntimeError(
                f"{call}: the {INLINE_BACKEND} weight-transfer engine is not initialised; "
                "call init_weight_transfer_engine first"
            )


def register_inline_backend() -> None:
    """Register :data:`INLINE_BACKEND` with vLLM's factory (once per process)."""
    # The factory's registry is its only lookup: a name already there is ours
    # (registering twice raises in vLLM).
    if INLINE_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(INLINE_BACKEND, InlineWeightTransferEngine)


def inline_update(
    weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> WeightTransferUpdateRequest:
    """The ``update_weights`` request that carries ``weights`` (name -> full tensor).

    Each tensor is copied to host memory and sent as its raw bytes.
    """
    items = weights.items() if isinstance(weights, Mapping) else weights
    info: dict[str, list[Any]] = {"names": [], "dtype_names": [], "shapes": [], "data": []}
    for name, tensor in items:
        host = tensor.detach().to("cpu").contiguous()
        info["names"].append(name)
        info["dtype_names"].append(str(host.dtype).removeprefix("torch."))
        info["shapes"].append(list(host.shape))
        info["data"].append(host.reshape(-1).view(torch.uint8).numpy().tobytes())
    return WeightTransferUpdateRequest(update_info=info)
