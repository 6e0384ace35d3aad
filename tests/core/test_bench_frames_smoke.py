"""benchmarks/bench_frames.py runs on every supported Python (no count asserted: the
figures are the benchmark's): its profiler sees loopbridge's frames of one crossing.

On Python 3.10, code objects have no ``co_qualname``; the profiler's AttributeError then
surfaced inside the measured call as a refusal of ``generate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import loopbridge

REPO = Path(__file__).resolve().parents[2]
SRC = str(Path(loopbridge.__file__).resolve().parent.parent)


def test_bench_frames_counts_the_frames_of_one_crossing() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_frames.py"), "--json", "--trace"],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    by_module = report["frames_by_module"]
    assert report["frames"] == sum(by_module.values()) > 0
    assert {"loopbridge proxy member", "loopbridge._ports"} <= set(by_module)
