"""benchmarks/bench_recipes.py runs (tiny sizes, no timing asserted): each
recipe and its run_coroutine_threadsafe baseline, from threads and from a loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import loopbridge

REPO = Path(__file__).resolve().parents[2]
SRC = str(Path(loopbridge.__file__).resolve().parent.parent)


def _results(*args: str) -> dict[str, dict[str, Any]]:
    """The report's rows of one run of the benchmark with ``args`` (tiny sizes)."""
    tiny = ["--calls", "32", "--reps", "1", "--workers", "4", "--concurrency", "4"]
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_recipes.py"), *tiny, *args],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout[result.stdout.index("{\n") :])
    results: dict[str, dict[str, Any]] = report["results"]
    for row in results.values():
        assert row["calls_per_s"]["run_coroutine_threadsafe"] > 0
        assert row["calls_per_s"]["loopbridge"] > 0
    return results


def _need(*modules: tuple[str, str]) -> None:
    """Skip, naming the distribution, where a recipes package is not installed (3.13t
    has no grpcio wheel)."""
    for name, dist in modules:
        pytest.importorskip(name, reason=f"{dist} is not installed (dependency group: recipes)")


def test_bench_recipes_runs() -> None:
    _need(("httpx", "httpx"), ("aiohttp", "aiohttp"), ("grpc", "grpcio"), ("uvicorn", "uvicorn"))
    # --pin: the client on one of the CPUs it may use, the servers' processes on the others.
    results = _results("--pin")
    assert sorted(results) == sorted(
        f"{c}, {w}" for c in ("httpx", "aiohttp", "grpc") for w in ("threads", "loop")
    )


def test_bench_recipes_stand_in_runs() -> None:
    """The grpc recipe's code on the stub that does no work, both ways, both callers."""
    _need(("grpc", "grpcio"), ("uvicorn", "uvicorn"))
    assert sorted(_results("--client", "stand-in")) == ["stand-in, loop", "stand-in, threads"]
