"""``python -m loopbridge_bench.sglang --quick`` end to end, and its configuration check.

No timing is asserted (speed goals live in the benchmark's own report): the quick run
must measure both modes in every scenario over real HTTP, every request must complete
with the tokens it asked for, and the report must carry the ratios and the targets.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopbridge_bench.common.load import _GENERATE_EVENT, Job, _body, _stream_end
from loopbridge_bench.sglang._stack import ConfigMismatchError, Stack

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.timeout(240)
def test_quick_bench_measures_stock_and_loopbridge(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "loopbridge_bench.sglang", "--quick", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "latency.json").read_text())
    meta, rows, targets = result["meta"], result["rows"], result["targets"]
    assert meta["modes"] == ["stock", "loopbridge"]
    assert meta["config"]["/model_info"]["model_type"] == "llama"
    scenarios = {"stream-c1", "stream-c4", "nostream-c1", "nostream-c4"}
    assert {(r["scenario"], r["mode"]) for r in rows} == {
        (s, m) for s in scenarios for m in ("stock", "loopbridge")
    }
    for r in rows:
        # Both rows measured: every request answered, with the tokens it asked for.
        assert (r["requests"], r["ok"], r["errors"]) == (8, 8, 0), r["error_examples"]
        assert r["engine_died"] == 0
        assert r["e2e_p50"] > 0 and r["rate_rps"] > 0
        if r["stream"]:
            assert r["ttft_p50"] < r["e2e_p50"] and not math.isnan(r["itl_p99"])
        if r["mode"] == "loopbridge":
            for key in ("e2e_p50_vs_stock", "p99_vs_stock", "rate_vs_stock"):
                assert r[key] > 0
    # Each job used its own prompts: no two requests of the run share one.
    hashes = [s["prompt_hash"] for rec in result["records"] for s in rec["samples"]]
    assert len(hashes) == len(set(hashes)) == meta["prompts_sent"] == 64
    tokens = {s["tokens"] for rec in result["records"] for s in rec["samples"]}
    assert tokens == {8}
    # The targets: every scenario checked, streaming ones on TTFT too.
    by_scenario = {t["scenario"] for t in targets}
    assert by_scenario == scenarios
    assert any(t["what"].startswith("TTFT p99") for t in targets if t["scenario"] == "stream-c4")
    assert all(isinstance(t["met"], bool) for t in targets)
    md = (out / "latency.md").read_text()
    assert "loopbridge / stock" in md and "Targets:" in md
    assert "Command: `python -m loopbridge_bench.sglang --quick --out" in md
    # The terminal gets the report; SGLang's logs go to a file.
    assert "Targets:" in proc.stdout and "| stream-c1 | stock |" in proc.stdout
    assert "UserWarning" not in proc.stdout + proc.stderr
    assert (out / "logs" / "sglang.log").exists()


def test_configurations_that_differ_fail_loudly() -> None:
    stack = Stack(0.001)
    try:
        same = {"/model_info": {"model_path": "m", "architectures": ["LlamaForCausalLM"]}}
        assert stack.check_same({"stock": same, "loopbridge": dict(same)}) == same
        other = {"/model_info": {"model_path": "m", "architectures": ["Qwen2ForCausalLM"]}}
        with pytest.raises(ConfigMismatchError, match="/model_info: architectures differ"):
            stack.check_same({"stock": same, "loopbridge": other})
        with pytest.raises(ConfigMismatchError, match="/model_info"):
            stack.check_same({"stock": same, "loopbridge": {}})
    finally:
        stack.stop()


def test_generate_requests_and_stream_parsing() -> None:
    job = Job(
        url="",
        model="",
        requests=2,
        concurrency=1,
        prompt_len=8,
        output_len=5,
        stream=True,
        timeout_s=1.0,
        endpoint="generate",
    )
    body, _digest = _body(job, 1)
    assert len(body["input_ids"]) == 8 and body["stream"] is True
    assert body["sampling_params"] == {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0.0}
    last = b'data: {"output_ids":[100,101],"meta_info":{"completion_tokens":2}}\n\n'
    stream = b'data: {"output_ids":[100],"meta_info":{"completion_tokens":1}}\n\n' + last
    assert len(_GENERATE_EVENT.findall(stream + b"data: [DONE]\n\n")) == 2
    assert _stream_end(stream + b"data: [DONE]\n\n", False, "generate") == (2, None)
    err = stream + b'data: {"error":{"message":"boom"}}\n\ndata: [DONE]\n\n'
    _tokens, msg = _stream_end(err, True, "generate")
    assert msg is not None and "boom" in msg
