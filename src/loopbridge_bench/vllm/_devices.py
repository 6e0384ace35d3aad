"""GPUs for the benchmark's engines: which devices each engine gets, what memory share.

The benchmark builds up to three engines: the correctness phase's, then stock's
(``vllm serve``) and the threaded stack's.  They start one after another (see
:func:`startup_order`), never concurrently: vLLM sizes its KV cache from a memory
profile taken at start-up, and another process's allocation during that
profile is counted as its own.

* With enough GPUs for both latency engines (``2 * tensor_parallel_size``), each
  gets devices of its own through ``CUDA_VISIBLE_DEVICES`` and vLLM's default
  memory share.  The correctness engine, gone before the others start, runs on
  the threaded stack's devices.
* Otherwise both latency engines share the first ``tensor_parallel_size``
  devices.  Each takes :data:`SHARED_HEADROOM` of half of the memory free
  before the first engine starts, as a fraction of the device's total (which is
  what ``gpu_memory_utilization`` means to vLLM).

The device list comes from a short child process (so that this process never
initializes CUDA before an engine's ``CUDA_VISIBLE_DEVICES`` is set), or from
``--fake-gpus`` in a dry run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = [
    "SHARED_HEADROOM",
    "Gpu",
    "Placement",
    "detect_gpus",
    "parse_fake_gpus",
    "place_engines",
    "startup_order",
]

#: The part of each engine's half of the free memory it may take on a shared device.
SHARED_HEADROOM = 0.9


@dataclass(frozen=True)
class Gpu:
    id: str  # what CUDA_VISIBLE_DEVICES names it by
    name: str
    total_mib: int
    free_mib: int


@dataclass(frozen=True)
class Placement:
    """Where one engine runs: ``devices`` None means wherever the environment says."""

    engine: str  # "correctness", "stock" or "threaded"
    devices: tuple[str, ...] | None
    gpu_memory_utilization: float | None  # None: vLLM's default (or the user's)
    shared: bool  # both latency engines on the same devices

    @property
    def env(self) -> dict[str, str]:
        return {} if self.devices is None else {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)}


def parse_fake_gpus(text: str) -> list[Gpu]:
    """``NAME:TOTAL_MIB:FREE_MIB`` entries, comma-separated, numbered from 0."""
    out = []
    for i, item in enumerate(x for x in text.split(",") if x.strip()):
        parts = item.strip().split(":")
        if len(parts) != 3:
            raise ValueError(f"expected NAME:TOTAL_MIB:FREE_MIB, got {item!r}")
        name, total, free = parts[0], int(parts[1]), int(parts[2])
        if not 0 < free <= total:
            raise ValueError(f"{item!r}: free memory must be in (0, total]")
        out.append(Gpu(str(i), name, total, free))
    return out


_QUERY = """
import json, torch
out = []
for i in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(i)
    out.append([torch.cuda.get_device_name(i), total >> 20, free >> 20])
print(json.dumps(out))
"""


def detect_gpus() -> list[Gpu]:
    """The visible CUDA devices, asked in a child process; [] when there are none."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _QUERY], capture_output=True, text=True, timeout=120
        )
        found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        found = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in visible.split(",")] if visible else []
    return [
        Gpu(ids[i] if i < len(ids) else str(i), name, int(total), int(free))
        for i, (name, total, free) in enumerate(found)
    ]


def startup_order(modes: list[str], correctness: bool) -> list[str]:
    """The engines in the order they start; each is ready (correctness: gone) before the next."""
    order = ["correctness"] if correctness else []
    if "stock" in modes:
        order.append("stock")
    if any(m != "stock" for m in modes):
        order.append("threaded")
    return order


def place_engines(
    gpus: list[Gpu], engines: list[str], tensor_parallel: int, user_share: float | None
) -> dict[str, Placement]:
    """Devices and memory share for each engine in ``engines`` (see the module docstring).

    Raises ``ValueError`` when there are fewer GPUs than ``tensor_parallel``.
    No GPUs (the CPU stand-in, or a dry run without ``--fake-gpus``): no placement.
    """
    if not gpus:
        return {e: Placement(e, None, user_share, False) for e in engines}
    if tensor_parallel > len(gpus):
        raise ValueError(
            f"--tensor-parallel-size {tensor_parallel} needs {tensor_parallel} GPUs; "
            f"{len(gpus)} visible"
        )
    latency = [e for e in engines if e != "correctness"]
    ids = [g.id for g in gpus]
    if len(latency) < 2 or len(gpus) >= 2 * tensor_parallel:
        own = {e: tuple(ids[:tensor_parallel]) for e in engines}
        if len(latency) == 2:
            own["stock"] = tuple(ids[:tensor_parallel])
            own["threaded"] = tuple(ids[tensor_parallel : 2 * tensor_parallel])
        if "correctness" in own and "threaded" in own:
            own["correctness"] = own["threaded"]
        return {e: Placement(e, own[e], user_share, False) for e in engines}
    shared = gpus[:tensor_parallel]
    if user_share is None:
        free = min(g.free_mib / g.total_mib for g in shared)
        user_share = math.floor(SHARED_HEADROOM * free / 2 * 100) / 100
        if user_share <= 0.05:
            raise ValueError(
                f"too little free GPU memory for two engines on one device "
                f"({free:.0%} free); free the GPU or run one of the sides (--modes)"
            )
    devices = tuple(g.id for g in shared)
    return {e: Placement(e, devices, user_share, True) for e in engines}
