"""benchmarks/bench_recipes_servers.py runs end to end against the session's servers
with tiny sizes, and reports every operation against every baseline. No timing is
asserted here: the ratios belong in the benchmark's own report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from .launch import Postgres, Redis

pytest.importorskip("asyncpg", reason="asyncpg is not installed (group: recipes)")
pytest.importorskip("sqlalchemy", reason="sqlalchemy is not installed (group: recipes)")
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_recipes_servers.py"


def test_bench_recipes_servers_tiny_run(pg: Postgres, redis_server: Redis, tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    cmd = [sys.executable, str(BENCH), "--reps", "1", "--ops", "32", "--concurrency", "4"]
    cmd += ["--postgres", pg.dsn, "--redis", redis_server.url, "--json", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    cells = {(r["operation"], r["caller"], r["baseline"]) for r in rows}
    operations = {r["operation"] for r in rows}
    assert len(operations) == 6
    for op in operations:
        assert (op, "loop c=4", "rcts") in cells and (op, "threads c=4", "rcts") in cells
    assert any(b == "nullpool" for _, _, b in cells)
    for r in rows:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
    assert "| ratio |" in result.stdout
