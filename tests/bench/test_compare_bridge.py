"""benchmarks/compare_bridge.py: pooled before/after ratios of bench_bridge runs.

Synthetic runs with known ratios: the same runs on both sides differ by nothing,
a shift beyond the tolerance is flagged (and fails ``--check``), and runs that
cannot be paired or compared are refused with a usage error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPARE = REPO / "benchmarks" / "compare_bridge.py"
KEYS = ("asyncio/calls/noop/c16/loopbridge", "asyncio/streams/w256")


def _run(path: Path, shift: float, spread: float = 0.01) -> Path:
    rows = [
        {
            "key": KEYS[0],
            "name": "loopbridge",
            "ratio": 0.35 + shift,
            "ratio_samples": [0.35 + shift + spread * d for d in (-1, 0, 1, -0.5, 0.5)],
        },
        {
            "key": KEYS[1],
            "name": "loopbridge-w256",
            "ratio": 0.01,
            "ratio_samples": [0.01] * 5,
        },
        # Rows that are not loopbridge's are not compared (their own baselines).
        {
            "key": "asyncio/calls/noop/c16/floor",
            "name": "floor",
            "ratio": 0.3,
            "ratio_samples": [0.3],
        },
        {"key": "asyncio/calls/noop/c16/rct", "name": "rct", "median_us": 30.0},
    ]
    path.write_text(json.dumps({"rows": rows}))
    return path


def _compare(
    tmp_path: Path, before: list[float], after: list[float], *extra: str
) -> subprocess.CompletedProcess[str]:
    b = [str(_run(tmp_path / f"b{i}.json", s)) for i, s in enumerate(before)]
    a = [str(_run(tmp_path / f"a{i}.json", s)) for i, s in enumerate(after)]
    cmd = [sys.executable, str(COMPARE), "--before", *b, "--after", *a, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _row(out: str, key: str) -> list[str]:
    line = next(x for x in out.splitlines() if x.startswith(f"| {key} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_same_runs_differ_by_nothing(tmp_path: Path) -> None:
    res = _compare(tmp_path, [0.0, 0.01, -0.01], [0.0, 0.01, -0.01], "--check")
    assert res.returncode == 0, res.stderr
    cells = _row(res.stdout, KEYS[0])
    assert cells[1:4] == ["0.3500", "0.3500", "+0.0000"]
    assert "floor" not in res.stdout and "/rct" not in res.stdout
    assert "0 of 2 rows above +0.02" in res.stdout


def test_a_shift_beyond_the_tolerance_is_flagged_and_fails_check(tmp_path: Path) -> None:
    res = _compare(tmp_path, [0.0, 0.0, 0.0], [0.05, 0.05, 0.05], "--check")
    assert res.returncode == 1, res.stdout + res.stderr
    cells = _row(res.stdout, KEYS[0])
    assert cells[3] == "+0.0500 **"
    low, high = (float(x) for x in cells[4].split(" … "))
    assert 0.02 < low <= 0.05 <= high
    assert cells[5] == "+0.0500"  # every pair moved by the same amount
    assert _row(res.stdout, KEYS[1])[3] == "+0.0000"
    assert "1 of 2 rows above +0.02 (1 with the whole interval above)" in res.stdout
    # Without --check the report is the same and the exit status 0.
    assert _compare(tmp_path, [0.0] * 3, [0.05] * 3).returncode == 0


def test_a_shift_within_the_tolerance_passes_check(tmp_path: Path) -> None:
    res = _compare(tmp_path, [0.0, 0.0], [0.015, 0.015], "--check")
    assert res.returncode == 0, res.stdout
    assert _row(res.stdout, KEYS[0])[3] == "+0.0150"


def test_runs_that_cannot_be_paired_are_refused(tmp_path: Path) -> None:
    res = _compare(tmp_path, [0.0, 0.0], [0.0])
    assert res.returncode == 2
    assert "--before has 2 runs and --after 1: pair them" in res.stderr


def test_runs_without_a_loopbridge_ratio_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"  # e.g. made with an --only that ran no loopbridge row
    empty.write_text(json.dumps({"rows": [{"key": "x/rct", "name": "rct", "median_us": 1.0}]}))
    cmd = [sys.executable, str(COMPARE), "--before", str(empty), "--after", str(empty)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "no row with a ratio is in every run" in res.stderr
