"""Smoke tests: every benchmark runs end to end with tiny sizes and reports sanely.

No timing is asserted here (speed goals live in the benchmarks' own reports);
these tests keep the benchmarks from rotting: each scenario runs, its baselines
run beside it, and the outputs (JSON, Markdown, plots) are complete.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH_BRIDGE = REPO / "benchmarks" / "bench_bridge.py"


def test_bench_bridge_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "bridge.json"
    md = tmp_path / "bridge.md"
    cmd = [
        sys.executable,
        str(BENCH_BRIDGE),
        "--reps",
        "2",
        "--warmup",
        "1",
        "--calls",
        "64",
        "--stream-items",
        "600",
        "--perhop-items",
        "50",
        "--same-loop-calls",
        "500",
        "--concurrency",
        "1,8",
        "--windows",
        "4,64",
        "--queue-size",
        "8",
        "--pin",
        "--json",
        str(out),
        "--markdown",
        str(md),
        "--quiet",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["pinned_cpu"] is not None
    rows = {r["key"]: r for r in result["rows"]}
    for loop in ("asyncio", "uvloop"):
        for method in ("noop", "yield1"):
            for c in (1, 8):
                assert f"{loop}/calls/{method}/c{c}/loopbridge" in rows
                assert f"{loop}/calls/{method}/c{c}/rct" in rows
            assert f"{loop}/calls/noop/c{c}/floor" in rows
        for name in ("rct", "loopbridge", "anyio"):
            assert f"{loop}/blocking/{name}" in rows
        for name in ("perhop", "queue", "janus", "culsans", "w4", "w64"):
            assert f"{loop}/streams/{name}" in rows
        assert f"{loop}/same-loop/proxy" in rows
    for row in result["rows"]:
        assert len(row["samples_us"]) == 2  # the warm-up repetition is dropped
        assert all(x > 0 and math.isfinite(x) for x in row["samples_us"])
        if row["baseline"] is not None:
            assert row["baseline"] in rows
            assert row["ratio"] > 0
    whats = {(t["loop"], t["what"]) for t in result["targets"]}
    assert ("uvloop", "calls/noop/c1") in whats and ("asyncio", "blocking") in whats
    table = md.read_text()
    for heading in ("Loop-to-loop calls", "Blocking calls", "Streams", "Same-loop", "Targets"):
        assert heading in table
    assert table.strip() in proc.stdout


def test_bench_bridge_rejects_bad_sizes() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH_BRIDGE), "--concurrency", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "positive integers" in proc.stderr


@pytest.mark.vllm
def test_latency_bench_tiny_run(tmp_path: Path) -> None:
    out = tmp_path / "latency"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "loopbridge_vllm.bench",
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--rounds",
        "1",
        "--warmup-rounds",
        "0",
        "--prompt-len",
        "8",
        "--output-len",
        "4",
        "--step-ms",
        "1",
        "--busy",
        "both",
        "--busy-slice-ms",
        "1",
        "--busy-period-ms",
        "5",
        "--refit-every-s",
        "0.2",
        "--refit-pause-ms",
        "10",
        "--timeout",
        "30",
        "--cache-dir",
        str(REPO / ".cache"),
        "--out",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "latency.json").read_text())
    rows = {(r["scenario"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {
        (s, m) for s in ("c2", "c2-busy") for m in ("unsafe", "per-hop", "loopbridge")
    }
    for (scenario, mode), row in rows.items():
        assert row["requests"] == 4
        if mode != "unsafe":  # the unsafe mode may legitimately lose requests
            assert row["errors"] == 0, row["error_examples"]
            assert row["ok"] == 4
            assert 0 < row["ttft_p50"] <= row["e2e_p50"] <= row["e2e_p99"]
            assert row["rate_rps"] > 0
        if mode == "loopbridge":
            assert row["p99_vs_unsafe"] > 0 and row["p99_vs_perhop"] > 0
    assert result["meta"]["busy_counters"]["slices"] > 0
    assert result["meta"]["busy_counters"]["refits"] > 0
    partial = (out / "latency.partial.jsonl").read_text().splitlines()
    assert len(partial) == 6  # one line per finished job, written as it ends
    table = (out / "latency.md").read_text()
    assert "| c2-busy | loopbridge |" in table
    for png in ("latency_cdf.png", "latency_p99.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stream_end_parsing() -> None:
    from loopbridge_vllm.bench._load import _FIRST_TEXT, _stream_end

    usage = b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}\n\ndata: [DONE]\n\n'
    body = b'data: {"choices":[{"text":"ab","index":0}]}\n\n' + usage
    assert _stream_end(body, error=False) == (4, None)
    # The tail may start mid-event: the cut-off line is skipped, not fatal.
    assert _stream_end(body[20:], error=False) == (4, None)
    err = b'data: {"error":{"message":"boom","code":500}}\n\n' + usage
    tokens, msg = _stream_end(err, error=True)
    assert msg is not None and "boom" in msg
    assert _stream_end(b"data: [DONE]\n\n", error=False) == (0, None)
    assert _FIRST_TEXT.search(b'{"text":"x"}') and not _FIRST_TEXT.search(b'{"text":""}')


def test_percentile_and_summary() -> None:
    from loopbridge_vllm.bench._report import percentile, summarize

    assert percentile([], 50) != percentile([], 50)  # NaN for no data
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0

    def rec(mode: str, e2e: float, warmup: bool = False) -> dict[str, object]:
        samples = [{"start": 0.0, "ttft": e2e / 2, "e2e": e2e, "tokens": 4, "error": None}] * 10
        return {
            "round": 0,
            "warmup": warmup,
            "concurrency": 2,
            "busy": False,
            "mode": mode,
            "wall_s": 1.0,
            "ok": 10,
            "tokens": 40,
            "engine_died": False,
            "samples": samples,
        }

    rows = summarize(
        [
            rec("unsafe", 1.0),
            rec("per-hop", 2.0),
            rec("loopbridge", 1.0),
            rec("loopbridge", 9.0, warmup=True),
        ]
    )
    lb = next(r for r in rows if r["mode"] == "loopbridge")
    assert lb["requests"] == 10  # the warm-up round is left out
    assert lb["p99_vs_unsafe"] == 1.0 and lb["p99_vs_perhop"] == 0.5
    assert [r["mode"] for r in rows] == ["unsafe", "per-hop", "loopbridge"]
