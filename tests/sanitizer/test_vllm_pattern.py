"""The vLLM pattern: a request's consumer on loop B waits on a collector's
asyncio.Event that the output handler on loop A sets. First with a collector of
the same shape, then with vLLM's own RequestOutputCollector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sanitizer_support import LoopInThread, SlotCollector, collector_pattern

import loopbridge
from loopbridge.sanitizer import sanitize

HERE = Path(__file__).resolve().parent
SRC = str(Path(loopbridge.__file__).resolve().parent.parent)


def _check_caught(result: dict[str, Any], put_file: str) -> None:
    reports = result["reports"]
    assert reports, "the cross-loop set() went unreported"
    first = reports[0]
    assert first["operation"] == "asyncio.Event.set"
    assert first["kind"] == "wrong-loop"
    assert (first["call_function"], first["call_thread"]) == ("put", "engine-loop")
    assert (first["bind_function"], first["bind_thread"]) == ("get", "server-loop")
    assert first["owner_thread"] == "server-loop"
    assert put_file in first["message"]
    assert "waiter of" in first["message"]


def test_slot_collector_cross_loop_caught() -> None:
    result = collector_pattern(SlotCollector, object)
    _check_caught(result, "sanitizer_support.py")


def test_slot_collector_caught_when_put_comes_first() -> None:
    """No waiter yet when A puts: the event is bound on first use, and B's
    get() is then the foreign side."""
    result = collector_pattern(SlotCollector, object, consumer_first=False)
    ops = [(r["operation"], r["call_function"], r["call_thread"]) for r in result["reports"]]
    assert ops and ops[0] == ("asyncio.Event.clear", "get", "server-loop")
    assert result["reports"][0]["bind_thread"] == "engine-loop"


def test_slot_collector_handoff_done_right_is_clean() -> None:
    """The safe path: the producer hands put() to the consumer's loop."""
    with (
        sanitize("raise") as block,
        LoopInThread("engine-loop") as a,
        LoopInThread("server-loop") as b,
    ):
        collector = b.call(SlotCollector)
        got = b.submit(collector.get())
        b.call(lambda: None)
        item = object()
        a.call(lambda: b.loop.call_soon_threadsafe(collector.put, item))
        assert got.result(5) is item
    assert block.reports == []


_VLLM_SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
from sanitizer_support import collector_pattern
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.output_processor import RequestOutputCollector

def make_collector():
    return RequestOutputCollector(RequestOutputKind.DELTA, "req-0")

def make_item():
    out = CompletionOutput(index=0, text="hi", token_ids=[10, 11],
                           cumulative_logprob=None, logprobs=None)
    return RequestOutput("req-0", "p", [1, 2], None, [out], finished=False)

print(json.dumps(collector_pattern(make_collector, make_item)))
"""


def test_real_vllm_request_output_collector_cross_loop_caught(tmp_path: Path) -> None:
    """vLLM 0.32's RequestOutputCollector with real RequestOutput objects, in a
    subprocess (vLLM's import takes seconds and wants its CPU environment)."""
    # vLLM is part of the test environment (scripts/setup.sh): no skip here.
    env = dict(os.environ)
    env.update(
        {
            "LOOPBRIDGE_CPU_PLATFORM": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
            "VLLM_RPC_BASE_PATH": str(tmp_path),
            "PYTHONPATH": os.pathsep.join([SRC, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
    )
    env.pop("LOOPBRIDGE_SANITIZE", None)
    proc = subprocess.run(
        [sys.executable, "-c", _VLLM_SCRIPT.format(here=str(HERE))],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["delivered"], "the scenario should still hand the output over"
    _check_caught(result, os.path.join("vllm", "v1", "engine", "output_processor.py"))
