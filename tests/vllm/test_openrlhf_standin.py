"""The stand-in worker's answers to OpenRLHF's ``WorkerWrap`` calls, without OpenRLHF.

A trainer thread is rank 0 of a two-rank gloo group, the worker rank 1: real
tensors cross by broadcast. A weight the worker cannot take (a wrong name,
dtype or shape) is refused after it was received, so the trainer's broadcast
completes and nothing is loaded; NCCL, ``ray.util.collective`` and CUDA IPC are
refused by name before anything waits.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from vllm_engines import free_port

from loopbridge_vllm._standin import (
    StandInModel,
    _StandInWorker,
    broadcast_from_trainer,
    weight_sync_group,
)


def _worker() -> _StandInWorker:
    return _StandInWorker(types.SimpleNamespace())  # type: ignore[arg-type]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_weights_cross_over_gloo_and_bad_ones_are_refused_without_a_hang() -> None:
    worker = _worker()
    vocab = worker.model.vocab_size
    with pytest.raises(RuntimeError, match="before init_process_group"):
        worker.update_weight("token_table", torch.float32, (20, vocab))
    port = free_port()
    joining, trainer = _in_thread(lambda: weight_sync_group("127.0.0.1", port, 0, 2))
    worker.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", backend="gloo")
    joining.join(60)
    [group] = trainer
    with pytest.raises(RuntimeError, match="already in a weight-sync group"):
        worker.init_process_group("127.0.0.1", port, 1, 2, "openrlhf", backend="gloo")

    def send(tensor: torch.Tensor) -> threading.Thread:
        return _in_thread(lambda: broadcast_from_trainer(group, tensor))[0]

    table = StandInModel.table_for(40, vocab)
    sending = send(table)
    worker.update_weight("token_table", table.dtype, table.shape, empty_cache=True)
    sending.join(60)
    assert not sending.is_alive() and worker.standin_tokens()[:3] == [40, 41, 42]

    bad: list[tuple[str, torch.Tensor, str]] = [
        ("nope", table, "no weight 'nope'"),
        ("token_table", table.double(), "torch.float64"),
        ("token_table", table[:3], r"\(3, "),
    ]
    for name, tensor, error in bad:
        sending = send(tensor)
        with pytest.raises((KeyError, ValueError), match=error):
            worker.update_weight(name, tensor.dtype, tensor.shape)
        sending.join(60)
        assert not sending.is_alive(), name  # the trainer's broadcast completed
        assert worker.standin_tokens()[:3] == [40, 41, 42], name  # nothing loaded
    worker.shutdown()
    assert worker.sync_group is None


@pytest.mark.parametrize(
    ("backend", "use_ray"), [("nccl", False), ("gloo", True)], ids=["nccl", "ray-collective"]
)
def test_gpu_only_paths_are_refused_by_name(backend: str, use_ray: bool) -> None:
    worker = _worker()
    with pytest.raises(ValueError, match="backend='gloo'"):
        worker.init_process_group("127.0.0.1", 1, 1, 2, "g", backend=backend, use_ray=use_ray)
    with pytest.raises(RuntimeError, match="needs CUDA"):
        worker.update_weight_cuda_ipc("token_table", torch.float32, (1,), {})
    assert worker.sync_group is None
