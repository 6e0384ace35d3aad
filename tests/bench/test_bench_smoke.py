"""Smoke tests: every benchmark runs end to end with tiny sizes and reports sanely.

No timing is asserted here (speed goals live in the benchmarks' own reports);
these tests keep the benchmarks from rotting: each scenario runs, its baselines
run beside it, and the outputs (JSON, Markdown, plots) are complete.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .records import job_record

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


def test_bench_bridge_caller_threads_group(tmp_path: Path) -> None:
    out = tmp_path / "threads.json"
    cmd = [sys.executable, str(BENCH_BRIDGE), "--only", "threads", "--loops", "asyncio"]
    cmd += ["--caller-threads", "1,2", "--calls", "64", "--reps", "2", "--quiet"]
    proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["key"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"asyncio/threads/t1", "asyncio/threads/t2"}
    assert rows["asyncio/threads/t2"]["baseline"] == "asyncio/threads/t1"
    assert all(x > 0 for r in rows.values() for x in r["samples_us"])
    assert "Caller threads into one owner loop" in proc.stdout


def test_bench_bridge_rejects_bad_sizes() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH_BRIDGE), "--concurrency", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2 and "positive integers" in proc.stderr


def _src_env() -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )


@pytest.mark.vllm
@pytest.mark.timeout(480)  # the run bounds itself (400 s); on a loaded 2-core machine it needs it
def test_latency_bench_tiny_run(tmp_path: Path) -> None:
    """Every mode (stock ``vllm serve`` included) and the correctness phase, end to end:
    both endpoints, lognormal lengths, closed loop and an open-loop rate."""
    out = tmp_path / "latency"
    cmd = [
        sys.executable,
        "-m",
        "loopbridge_bench.vllm",
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
        "--stream",
        "both",
        "--endpoint",
        "both",
        "--lengths",
        "lognormal",
        "--rate-fractions",
        "0.5",
        "--busy",
        "both",
        "--busy-slice-ms",
        "1",
        "--busy-period-ms",
        "5",
        "--busy-work",
        "native",
        # The busy load starts with each job: a refit within its first millisecond.
        "--refit-every-s",
        "0.001",
        "--refit-pause-ms",
        "1",
        "--race-requests",
        "16",
        "--race-concurrency",
        "4",
        "--timeout",
        "30",
        "--cache-dir",
        str(REPO / ".cache"),
        "--out",
        str(out),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=400, cwd=REPO, env=_src_env()
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "latency.json").read_text())
    meta = result["meta"]
    modes = ("stock", "unsafe", "per-hop", "loopbridge", "on-engine-loop")
    ours = ("loopbridge", "on-engine-loop")
    scenarios = [
        f"{st}{ep}-{load}{busy}"
        for st in ("stream", "nostream")
        for ep in ("", "-chat")
        for load in ("c2", "r0.5")
        for busy in ("", "-busy")
    ]
    rows = {(r["scenario"], r["mode"]): r for r in result["rows"]}
    assert set(rows) == {(s, m) for s in scenarios for m in modes}
    for (scenario, mode), row in rows.items():
        assert row["requests"] == 4
        if mode != "unsafe":  # the unsafe mode may legitimately lose requests
            assert row["errors"] == 0, row["error_examples"]
            assert row["ok"] == 4
            assert 0 < row["ttft_p50"] <= row["e2e_p50"] <= row["e2e_p99"] <= row["e2e_max"]
            assert row["rate_rps"] > 0 and row["cpu_per_request"] >= 0
            if row["stream"]:  # lognormal outputs of 1..16 tokens: most have gaps
                assert 0 <= row["itl_p50"] <= row["itl_p99"] <= row["itl_max"]
                assert row["tpot_p50"] > 0
            else:
                assert math.isnan(row["tpot_p50"]) and math.isnan(row["itl_p50"])
        if mode != "stock":
            assert row["p99_vs_stock"] > 0 and row["rate_vs_stock"] > 0
        if mode in ours:
            assert row["p99_vs_unsafe"] > 0 and row["p99_vs_perhop"] > 0
        if "-r0.5" in scenario:
            capacity = meta["capacity_rps"][scenario.replace("-r0.5", "-c2")]
            assert row["offered_rps"] == pytest.approx(capacity * 0.5)
    # Server CPU is read in clock ticks (10 ms): a 4-request job may read 0, a run may not.
    for mode in modes:
        assert sum(r["server_cpu_s"] for r in result["records"] if r["mode"] == mode) > 0
    # Full collections during each job are counted; the run's records were frozen between
    # jobs, and the report says how many ran while the threaded modes were measured.
    assert all(r["gc_full"] >= 0 and r["gc_full_s"] >= 0 for r in result["records"])
    measured = [r for r in result["records"] if not r["warmup"] and r["mode"] != "stock"]
    assert meta["gc_frozen_between_jobs"] is True
    assert meta["gc_full_collections"] == sum(r["gc_full"] for r in measured)
    assert (
        f"{meta['gc_full_collections']} full GC collections in this process during their "
        "measured jobs" in (out / "latency.md").read_text()
    )
    # Every request of the run had a prompt of its own (stock's, every mode's, every round's).
    sent = [s for rec in result["records"] for s in rec["samples"]]
    hashes = [s["prompt_hash"] for s in sent]
    assert len(hashes) == 4 * len(modes) * len(scenarios) and len(set(hashes)) == len(hashes)
    assert meta["prompts_sent"] == len(hashes) + 2 * 16  # and the correctness phase's
    # The client stamps when each request's body left it: after it meant to send it,
    # before its answer began; and it measures its own CPU time per job.
    for s in sent:
        if s["error"] is None:
            assert s["sent_at"] < s["written_at"] <= s["sent_at"] + s["ttft"], s
    assert all(rec["client_cpu_s"] > 0 for rec in result["records"])
    assert {s["output_len"] for s in sent} != {4}  # lognormal: lengths vary
    assert not meta["prefix_cache"]["enabled"]
    # One engine at a time: the correctness engine gone before stock starts, stock
    # ready before the threaded stack starts.
    events = [(e["engine"], e["event"]) for e in meta["startup"]]
    assert events == [
        ("correctness", "start"),
        ("correctness", "stopped"),
        ("stock", "start"),
        ("stock", "ready"),
        ("threaded", "start"),
        ("threaded", "ready"),
    ]
    assert [e["t_s"] for e in meta["startup"]] == sorted(e["t_s"] for e in meta["startup"])
    # Both latency engines' KV caches were read and agree (same configuration).
    kv = meta["kv_cache"]
    assert kv["threaded"]["blocks"] > 0 and kv["stock"]["tokens"] > 0
    assert meta["kv_cache_difference"] is not None and meta["kv_cache_difference"] <= 0.01
    # The stock rows really came from a `vllm serve` process of the same release.
    assert meta["stock_command"][:2] == ["vllm", "serve"]
    assert meta["stock_vllm_version"] == meta["versions"]["vllm"] != "?"
    assert meta["versions"]["torch"] != "?"
    checks = {(t["scenario"], t["what"]) for t in result["targets"]}
    assert ("stream-c2", "TTFT p99 ≤ 1.05x stock") in checks
    assert ("nostream-c2", "req/s ≥ 0.98x stock") in checks
    assert ("stream-c2 (on-engine-loop)", "TTFT p99 ≤ 1.05x stock") in checks
    assert meta["busy_counters"]["slices"] > 0
    assert meta["busy_counters"]["refits"] > 0
    assert meta["busy_load"]["work"] == "native"
    partial = (out / "latency.partial.jsonl").read_text().splitlines()
    assert len(partial) == len(modes) * len(scenarios)  # one line per finished job, as it ends
    version = f"vLLM {meta['versions']['vllm']}, torch {meta['versions']['torch']}"
    table = (out / "latency.md").read_text()
    assert "| stream-c2-busy | loopbridge |" in table and "| nostream-c2 | stock |" in table
    assert "| stream-chat-r0.5 | loopbridge |" in table and "ITL" in table
    assert "| stream-c2-busy | on-engine-loop |" in table
    assert "blocks its loop (`--busy-work native`: hashing in C with the GIL released" in table
    assert len(result["headlines"]) == len(ours) * len(scenarios)
    for line in result["headlines"]:
        assert line.startswith(tuple(scenarios)) and line in proc.stdout
    assert version in table and "Command: `python -m loopbridge_bench.vllm" in table
    for png in ("latency_cdf.png", "latency_itl.png", "latency_p99.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The correctness phase: the raw engine broke, loopbridge served every request.
    race = json.loads((out / "correctness.json").read_text())
    outcomes = {o["mode"]: o for o in race["outcomes"]}
    unsafe, ours = outcomes["unsafe"], outcomes["loopbridge"]
    assert unsafe["verdict"] == "BROKEN" and unsafe["expected"]
    assert "deque mutated during iteration" in unsafe["handler_error"]
    assert not unsafe["engine_alive"] and unsafe["ok"] < 16 and unsafe["overlaps"] >= 1
    assert ours["verdict"] == "SAFE" and ours["expected"]
    assert ours["ok"] == 16 and ours["engine_alive"] and ours["foreign_sets"] == 0
    race_md = (out / "correctness.md").read_text()
    assert version in race_md and "| unsafe | " in race_md
    _check_terminal_output(proc, out, result, len(scenarios))


#: What an engine, server or Python warning line starts with, or contains.
_LOG_LINE = re.compile(
    r"^\((EngineCore|MainProcess|APIServer)[^)]*\)|^(INFO|WARNING|ERROR|DEBUG)[: ]|"
    r"Traceback \(most recent call last\)|Warning:|^\s+File \""
)
#: One state of a tqdm bar, as written to a pipe (separated by carriage returns).
_BAR = re.compile(r"\d+/\d+ \[[^\]]*\]\s*$")


def _terminal_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """Every line the run printed, stdout and stderr, without the progress bar's states."""
    lines = proc.stdout.splitlines()
    for line in proc.stderr.split("\n"):
        kept = [seg for seg in line.split("\r") if seg.strip() and not _BAR.search(seg)]
        lines += kept
    return lines


def _check_terminal_output(
    proc: subprocess.CompletedProcess[str], out: Path, result: dict[str, Any], n_scenarios: int
) -> None:
    """The main job's terminal: setup lines, the bar, verdicts, the table, where the files are;
    every engine and server log in a file under OUT/logs/."""
    logs = out / "logs"
    lines = _terminal_lines(proc)
    assert not [line for line in lines if _LOG_LINE.search(line)], "\n".join(lines)
    assert f"bench: engine and server logs go to {logs}/" in proc.stderr
    assert "it/s]" not in proc.stderr  # no bar but the benchmark's own (model shards)
    # One verdict line per outcome, naming what happened and the log that shows it.
    unsafe = [line for line in lines if line.startswith("correctness, unsafe (raw engine")]
    ours = [line for line in lines if line.startswith("correctness, loopbridge (engine proxy)")]
    unsafe_log = logs / "correctness-unsafe.log"
    ours_log = logs / "correctness-loopbridge.log"
    assert len(unsafe) == 1 and len(ours) == 1, "\n".join(lines)
    assert "failed as expected: RuntimeError: deque mutated during iteration" in unsafe[0]
    assert unsafe[0].endswith(f"see {unsafe_log}")
    assert "passed as expected: every request completed (16 of 16)" in ours[0]
    assert ours[0].endswith(f"see {ours_log}")
    # The logs hold what the terminal no longer shows: the intended crash, the engines'
    # start-up (this process's, its EngineCore's, vllm serve's) and the servers.
    crash = unsafe_log.read_text()
    assert "deque mutated during iteration" in crash and "Traceback" in crash
    assert "(EngineCore" in ours_log.read_text()
    assert "(EngineCore" in (logs / "stock-server.log").read_text()
    assert (logs / "latency-threaded.log").exists()
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        [
            "correctness-loopbridge.log",
            "correctness-unsafe.log",
            "latency-threaded.log",
            "stock-server.log",
            *(["setup.log"] if (logs / "setup.log").exists() else []),
        ]
    )
    # The table and the headlines are on the terminal; the ratio and target tables in the file.
    rows = [line for line in lines if line.startswith("| ")]
    assert len(rows) == len(result["rows"]) + 1  # the header, then one per scenario and mode
    assert all(line in proc.stdout for line in result["headlines"])
    assert (
        "Against `stock`" not in proc.stdout
        and "Against `stock`" in (out / "latency.md").read_text()
    )
    last = proc.stdout.splitlines()[-2:]
    assert last[0].startswith("wrote (") and str(out / "latency.md") in last[0]
    assert last[1].startswith("logs: ") and str(unsafe_log) in last[1]
    # The line budget: a few fixed lines, then per scenario and mode of loopbridge's a
    # headline and at most one line of missed targets, and the table rows. The default
    # run (6 scenarios, 30 rows) stays under 80 lines.
    assert len(lines) <= _budget(n_scenarios, len(result["rows"])), "\n".join(lines)
    assert _budget(6, 30) < 80


def _budget(scenarios: int, rows: int, ours: int = 2) -> int:
    # setup line, 2 verdicts, the setting, 3 table-header lines, targets, wrote, logs, blanks
    return 16 + 2 * ours * scenarios + rows


GPU_BENCH = REPO / "scripts" / "gpu-bench.sh"


H100 = "NVIDIA H100 80GB HBM3:81559:80000"


def test_gpu_bench_without_vllm_says_what_to_run(tmp_path: Path) -> None:
    """A fresh clone has no .venv-gpu: one line naming --setup, not a traceback."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    proc = subprocess.run(
        ["bash", str(GPU_BENCH), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, PYTHON=str(bare / "bin" / "python")),
    )
    assert proc.returncode == 2
    first, *rest = proc.stderr.splitlines()
    assert "cannot import torch and vllm" in first and "--setup" in first, proc.stderr
    assert "Traceback" not in proc.stderr and rest == [
        "run 'bash scripts/gpu-bench.sh --help' for usage"
    ]


@pytest.mark.vllm
def test_gpu_bench_dry_run(tmp_path: Path) -> None:
    """The GPU script's arguments, model resolution, device placement, start-up order and
    engine/stock set-up, without a GPU (a fake device list)."""
    env = dict(_src_env(), PYTHON=sys.executable)
    caller = tmp_path / "caller"
    caller.mkdir()

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(GPU_BENCH), *args],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=caller,  # relative paths are the caller's, not the repository's
            env=env,
        )

    # One GPU: both latency engines share it, each with its share of the free memory.
    proc = script("--dry-run", "--out", "gpu", "--", "--concurrency", "1,8", "--fake-gpus", H100)
    assert proc.returncode == 0, proc.stderr[-4000:]
    plan = json.loads(proc.stdout)
    model = REPO / ".cache" / "tiny-model"
    assert plan["engine"] == "local model" and plan["model"] == str(model)
    assert plan["engine_class"] == "vllm.v1.engine.async_llm.AsyncLLM"
    # The GPU executor (no stand-in), GPU-friendly dtype, no prefix caching, the share.
    share = str(math.floor(0.9 * 80000 / 81559 / 2 * 100) / 100)
    assert plan["engine_args"]["distributed_executor_backend"] == "None"
    assert plan["engine_args"]["dtype"] == "'bfloat16'"
    assert plan["engine_args"]["enable_prefix_caching"] == "False"
    assert plan["engine_args"]["gpu_memory_utilization"] == share == "0.44"
    stock = plan["stock_command"]
    assert stock[:3] == ["vllm", "serve", str(model)]
    assert "--distributed-executor-backend" not in stock and "--no-enable-prefix-caching" in stock
    assert plan["stock_parsed"]["gpu_memory_utilization"] == share
    assert plan["stock_parsed"]["enable_prefix_caching"] == "False"
    assert plan["stock_parsed"]["dtype"] == "'bfloat16'"
    assert plan["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert plan["startup_order"] == ["correctness", "stock", "threaded"]
    assert {p["CUDA_VISIBLE_DEVICES"] for p in plan["placement"].values()} == {"0"}
    assert all(p["shared_devices"] for p in plan["placement"].values())
    # The script's workload: both endpoints, an open-loop sweep.
    keys = [s["key"] for s in plan["scenarios"]]
    assert keys[:4] == ["stream-c1", "stream-c8", "nostream-c1", "nostream-c8"]
    assert "stream-chat-c8" in keys and "nostream-chat-r0.9" in keys
    assert plan["modes"] == ["stock", "unsafe", "per-hop", "loopbridge", "on-engine-loop"]
    assert plan["out"] == str(caller / "gpu")
    assert not (caller / "gpu").exists()  # nothing ran

    # Two GPUs: one each, vLLM's own share; four with tensor parallel 2: two each.
    two = json.loads(script("--dry-run", "--", "--fake-gpus", f"{H100},{H100}").stdout)
    placed = two["placement"]
    assert placed["stock"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert placed["threaded"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert placed["correctness"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert placed["stock"]["gpu_memory_utilization"] is None
    assert "--gpu-memory-utilization" not in two["stock_command"]
    four = script(
        "--dry-run", "--", "--fake-gpus", ",".join([H100] * 4), "--tensor-parallel-size", "2"
    )
    assert four.returncode == 0, four.stderr[-4000:]
    plan4 = json.loads(four.stdout)
    assert plan4["placement"]["threaded"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert plan4["stock_parsed"]["tensor_parallel_size"] == "2"
    too_few = script("--dry-run", "--", "--fake-gpus", H100, "--tensor-parallel-size", "2")
    assert too_few.returncode != 0 and "needs 2 GPUs; 1 visible" in too_few.stderr

    bad = script("--bogus")
    assert bad.returncode == 2 and "unknown argument '--bogus'" in bad.stderr
    (caller / "empty").mkdir()
    missing = script("--dry-run", "--model", "empty")  # relative to the caller
    assert missing.returncode == 2 and f"{caller / 'empty'}: not a Hugging" in missing.stderr
    usage = script("--help")
    assert usage.returncode == 0 and "--model DIR" in usage.stdout and "--setup" in usage.stdout


_MISMATCH = """
import sys
from pathlib import Path
from loopbridge_bench.vllm._stack import EngineSpec, engine_args, prepare_model
from loopbridge_bench.vllm._stock import check_stock_argv, stock_argv
spec = EngineSpec(None, Path(sys.argv[1]), 0.0, 8, 256)
ours = engine_args(spec, prepare_model(spec))
argv = stock_argv(ours, "127.0.0.1", 8000)
check_stock_argv(argv, ours)  # the same engine: passes
for extra in (["--max-num-seqs", "4"], ["--enable-chunked-prefill"], ["--no-such-option"]):
    try:
        check_stock_argv(argv + extra, ours)
    except ValueError as exc:
        print("refused:", exc)
"""


@pytest.mark.vllm
def test_stock_command_must_build_the_same_engine() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _MISMATCH, str(REPO / ".cache")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=_src_env(),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    refused = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
    assert len(refused) == 3, proc.stdout
    assert "max_num_seqs" in refused[0] and "enable_chunked_prefill" in refused[1]
    assert "does not accept ['--no-such-option']" in refused[2]


def test_requests_per_job_and_stock_flags() -> None:
    from loopbridge_bench.vllm._run import parse_args, requests_for
    from loopbridge_bench.vllm._stock import _flag

    args = parse_args([])
    assert args.concurrency == [1, 16, 64] and args.stream == "both"
    assert args.modes == ["stock", "unsafe", "per-hop", "loopbridge", "on-engine-loop"]
    assert [requests_for(args, c, False) for c in (1, 16, 64, 128)] == [16, 256, 1024, 1024]
    assert [requests_for(args, c, True) for c in (1, 16, 64)] == [4, 64, 256]
    fixed = parse_args(["--requests", "40", "--no-stream"])
    assert fixed.stream == "off" and requests_for(fixed, 64, False) == 40
    assert _flag("enforce_eager", True) == ["--enforce-eager"]
    assert _flag("enable_prefix_caching", False) == ["--no-enable-prefix-caching"]
    assert _flag("gpu_memory_utilization", 0.5) == ["--gpu-memory-utilization", "0.5"]
    assert _flag("served_model_name", ["a", "b"]) == ["--served-model-name", "a", "b"]
    assert _flag("override_generation_config", {"a": 1}) == [
        "--override-generation-config",
        '{"a": 1}',
    ]


def test_stream_end_parsing() -> None:
    from loopbridge_bench.common.load import _FIRST_TEXT, _stream_end

    usage = b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}\n\ndata: [DONE]\n\n'
    body = b'data: {"choices":[{"text":"ab","index":0}]}\n\n' + usage
    assert _stream_end(body, error=False) == (4, None)
    # The tail may start mid-event: the cut-off line is skipped, not fatal.
    assert _stream_end(body[20:], error=False) == (4, None)
    err = b'data: {"error":{"message":"boom","code":500}}\n\n' + usage
    _tokens, msg = _stream_end(err, error=True)
    assert msg is not None and "boom" in msg
    assert _stream_end(b"data: [DONE]\n\n", error=False) == (0, None)
    assert _FIRST_TEXT.search(b'{"text":"x"}') and not _FIRST_TEXT.search(b'{"text":""}')


def test_percentile_and_summary() -> None:
    from loopbridge_bench.vllm._report import percentile, summarize, target_checks

    assert percentile([], 50) != percentile([], 50)  # NaN for no data
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0

    from loopbridge_bench.common.load import Sample
    from loopbridge_bench.common.record import JobRecord

    def rec(mode: str, e2e: float, warmup: bool = False) -> JobRecord:
        samples = [Sample(start=0.0, ttft=e2e / 2, e2e=e2e, tokens=4, error=None)] * 10
        return job_record(mode, samples, warmup=warmup)

    rows = summarize(
        [
            rec("stock", 0.5),
            rec("unsafe", 1.0),
            rec("per-hop", 2.0),
            rec("loopbridge", 1.0),
            rec("loopbridge", 9.0, warmup=True),
        ]
    )
    lb = next(r for r in rows if r["mode"] == "loopbridge")
    assert lb["requests"] == 10  # the warm-up round is left out
    assert lb["p99_vs_unsafe"] == 1.0 and lb["p99_vs_perhop"] == 0.5
    assert lb["p99_vs_stock"] == 2.0 and lb["ttft_p50_vs_stock"] == 2.0
    assert lb["rate_vs_stock"] == 1.0
    assert [r["mode"] for r in rows] == ["stock", "unsafe", "per-hop", "loopbridge"]
    checks = {t["what"]: t["met"] for t in target_checks(rows)}
    assert checks["e2e p99 ≤ 1.05x stock"] is False and checks["req/s ≥ 0.98x stock"] is True
    assert checks["TTFT p50 ≤ 1.05x stock"] is False  # streaming is the default


def test_client_share_and_its_warning() -> None:
    """The report says how busy the load generator was, and warns when it may have
    delayed its own requests."""
    from loopbridge_bench.common.summary import CLIENT_BUSY_SHARE, client_line, client_share

    assert client_share([(0.5, 2.0), (1.5, 2.0)]) == 0.5
    assert math.isnan(client_share([]))
    rows = [
        {"scenario": "stream-c16", "mode": "stock", "client_cpu_share": 0.1},
        {"scenario": "stream-c64", "mode": "loopbridge", "client_cpu_share": 0.3},
        {"scenario": "stream-c64", "mode": "per-hop", "client_cpu_share": math.nan},
    ]
    (line,) = client_line(rows)
    assert line == "The load generator used at most 30% of a core (stream-c64, loopbridge)."
    rows[0]["client_cpu_share"] = CLIENT_BUSY_SHARE + 0.4
    (line,) = client_line(rows)
    assert line.startswith("The load generator used at most 90% of a core (stream-c16, stock)")
    assert "may delay its own requests" in line
    assert client_line([rows[2]]) == []


def test_a_job_record_comes_back_from_its_json() -> None:
    """latency.json's records read back as they were (scripts/latency-ranges.py reads them)."""
    from loopbridge_bench.common.load import Sample
    from loopbridge_bench.common.record import JobRecord

    sample = Sample(start=0.0, ttft=0.01, e2e=0.2, tokens=4, itl=[0.005], written_at=1.5)
    rec = job_record(
        samples=[sample], round=1, client_cpu_s=0.1, stages=[{"engine step": 0.01}],
        extra={"gc_full": 2.0},
    )  # fmt: skip
    assert JobRecord.from_json(json.loads(json.dumps(rec.as_json()))) == rec
