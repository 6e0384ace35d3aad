"""The stage probe of the latency benchmark: marks, their stages, the report rows.

No timing is asserted: the marks are checked by their order and their keys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")


from loopbridge_bench.common.load import REQUEST_ID_HEADER, Sample, request_id
from loopbridge_bench.common.record import JobRecord
from loopbridge_bench.vllm._stages import (
    STAGES,
    StageProbe,
    TimedClient,
    stage_rows,
    stages_markdown,
    stages_of,
    tail_markdown,
    tail_rows,
)

from .records import job_record

REPO = Path(__file__).resolve().parents[2]


def test_stages_chain_the_marks_in_order() -> None:
    # Every stage starts where the one before it ended: their sum is the TTFT.
    for (_, _, end), (_, start, _) in itertools.pairwise(STAGES):
        assert end == start
    marks = {name: float(i) for i, name in enumerate(["sent", *(b for _, _, b in STAGES)])}
    stages = stages_of(marks)
    assert list(stages) == [name for name, _, _ in STAGES]
    assert all(v == 1.0 for v in stages.values())
    assert sum(stages.values()) == marks["first"] - marks["sent"]


def test_stages_of_skips_stages_with_a_missing_mark() -> None:
    stages = stages_of({"sent": 0.0, "http_parsed": 0.25, "http_in": 0.5, "owner_start": 2.0})
    # No ``written`` (a client that did not record it): neither stage beside it.
    assert stages == {"parsed to app call": 0.25}


def test_the_probe_keeps_the_first_mark_of_each_request() -> None:
    probe = StageProbe()
    probe.mark("cmpl-lb12-0", "owner_yield", 1.0)
    probe.mark("cmpl-lb12-0", "owner_yield", 2.0)  # a later output of the same request
    probe.mark("cmpl-someone-else-0", "owner_yield", 3.0)  # not the benchmark's: ignored
    assert probe.marks == {12: {"owner_yield": 1.0}}
    assert probe.take([12, 13]) == {12: {"owner_yield": 1.0}}
    assert probe.marks == {}


def test_install_patches_vllm_and_uninstall_restores_it() -> None:
    from uvicorn.protocols.http.h11_impl import RequestResponseCycle
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.output_processor import OutputProcessor

    generate, process = AsyncLLM.generate, OutputProcessor.process_outputs
    parsed = RequestResponseCycle.__init__
    probe = StageProbe().install()
    try:
        assert AsyncLLM.generate is not generate
        assert OutputProcessor.process_outputs is not process
        assert RequestResponseCycle.__init__ is not parsed
        assert AsyncLLM.generate.__wrapped__ is generate  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match="already installed"):
            probe.install()
    finally:
        probe.uninstall()
    assert AsyncLLM.generate is generate
    assert OutputProcessor.process_outputs is process
    assert RequestResponseCycle.__init__ is parsed


class _Processor:
    """vLLM's ``OutputProcessor.process_outputs``, as the probe's wrapper sees it."""

    def process_outputs(self, outputs: Any, engine_core_timestamp: Any = None) -> str:
        return "processed"


def test_output_marks_take_the_engines_first_queued_and_scheduled_events() -> None:
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput

    probe = StageProbe()
    process = probe._process(_Processor)
    kinds = EngineCoreEventType
    events = [
        EngineCoreEvent(kinds.QUEUED, 1.0),
        EngineCoreEvent(kinds.SCHEDULED, 2.0),
        EngineCoreEvent(kinds.PREEMPTED, 2.5),  # no mark of its own
        EngineCoreEvent(kinds.QUEUED, 3.0),  # queued again after the preemption: not moved
    ]
    first = EngineCoreOutput(request_id="cmpl-lb3-0", new_token_ids=[7], events=events)
    assert process(_Processor(), [first], 4.0) == "processed"
    # A later output of the request (no events without stats): moves nothing.
    later = EngineCoreOutput(request_id="cmpl-lb3-0", new_token_ids=[8], events=None)
    process(_Processor(), [later], 9.0)
    marks = probe.marks[3]
    assert (marks["core_queued"], marks["core_scheduled"], marks["core_out"]) == (1.0, 2.0, 4.0)
    assert set(marks) == {"core_queued", "core_scheduled", "core_out", "handler_in", "handler_out"}
    assert stages_of({"owner_start": 0.5, **marks})["to the engine's queue"] == 0.5


def test_the_stage_probe_turns_vllms_stats_on_in_both_engines(tmp_path: Path) -> None:
    """The EngineCore records its events only with stats on: ``--stages on`` turns them
    on in the threaded stack's engine and, from the same arguments, in stock's."""
    from loopbridge_bench.vllm._args import parse_args
    from loopbridge_bench.vllm._run import _spec
    from loopbridge_bench.vllm._stack import engine_args
    from loopbridge_bench.vllm._stock import stock_argv

    for stages, on in (("on", True), ("off", False)):
        spec = _spec(parse_args(["--stages", stages, "--cache-dir", str(tmp_path)]))
        eargs = engine_args(spec, tmp_path)
        assert spec.log_stats is on and eargs.disable_log_stats is not on
        assert ("--disable-log-stats" in stock_argv(eargs, "127.0.0.1", 1)) is not on


class _Client:
    """An engine client whose stream the test steps through."""

    model_config = "config"

    def __init__(self) -> None:
        self.closed = False

    async def generate(self, prompt: Any, params: Any, rid: str) -> Any:
        try:
            for i in range(3):
                yield i
        finally:
            self.closed = True


def test_timed_client_marks_the_call_and_the_first_output_and_closes_the_stream() -> None:
    probe = StageProbe()
    inner = _Client()
    client = TimedClient(inner, probe)
    assert client.model_config == "config"  # everything else is the client's own

    async def main() -> list[Any]:
        stream = client.generate("p", None, "cmpl-lb7-0")
        assert set(probe.marks[7]) == {"http_generate"}
        first = await stream.__anext__()
        await stream.aclose()  # the consumer leaves early
        return [first]

    assert asyncio.run(main()) == [0]
    assert set(probe.marks[7]) == {"http_generate", "http_recv"}
    assert probe.marks[7]["http_generate"] <= probe.marks[7]["http_recv"]
    assert inner.closed


def test_middleware_marks_arrival_and_first_body_chunk_of_the_benchmarks_requests() -> None:
    probe = StageProbe()
    sent: list[Any] = []
    seen: list[set[str]] = []  # request 5's marks before its first body chunk

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen.append(set(probe.marks.get(5, {})))
        await send({"type": "http.response.body", "body": b"data: 1", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def send(message: Any) -> None:
        sent.append(message)

    middleware = probe.middleware()
    wrapped = middleware.cls(app, *middleware.args, **middleware.kwargs)
    header = (REQUEST_ID_HEADER.lower().encode(), request_id(5).encode())
    asyncio.run(wrapped({"type": "http", "headers": [header]}, None, send))
    asyncio.run(wrapped({"type": "http", "headers": []}, None, send))  # not marked
    assert len(sent) == 6  # every message passed on
    assert seen[0] == {"http_in"}  # the response start is no body chunk
    assert set(probe.marks) == {5}
    assert probe.marks[5]["http_in"] <= probe.marks[5]["http_body"]


def test_stage_rows_pool_measured_requests_per_scenario_and_mode() -> None:
    def rec(mode: str, warmup: bool, values: list[float]) -> JobRecord:
        return job_record(
            mode, warmup=warmup, concurrency=16, stages=[{"output handler": v} for v in values]
        )

    rows = stage_rows(
        [
            rec("loopbridge", True, [9.0]),  # warm-up: never counted
            rec("loopbridge", False, [0.001, 0.003]),
            rec("loopbridge", False, [0.002]),
            rec("per-hop", False, [0.010]),
            rec("stock", False, []),  # no server-side marks: no row
        ]
    )
    by = {(r["scenario"], r["mode"]): r for r in rows}
    assert set(by) == {("stream-c16", "loopbridge"), ("stream-c16", "per-hop")}
    cell = by["stream-c16", "loopbridge"]["output handler"]
    assert cell["n"] == 3 and cell["p50_ms"] == pytest.approx(2.0)
    assert by["stream-c16", "loopbridge"]["engine step"]["n"] == 0
    table = stages_markdown(rows)
    assert any(line.startswith("| stream-c16 | per-hop | ") for line in table)
    assert stages_markdown([]) == []


def test_tail_rows_name_the_stage_where_the_slowest_first_tokens_wait() -> None:
    """100 requests; the two slowest (2%) waited 30 ms more before the HTTP loop, the
    rest had the same stages: that stage alone carries the tail's excess."""

    def sample(ttft: float) -> Sample:
        return Sample(start=0.0, ttft=ttft, e2e=ttft, tokens=1)

    fast = {"client before sending": 0.002, "engine step": 0.010}
    slow = {"client before sending": 0.032, "engine step": 0.010}
    samples = [sample(0.012) for _ in range(98)] + [sample(0.042), sample(0.042)]
    failed = Sample(start=0.0, ttft=9.0, e2e=9.0, tokens=0, error="boom")  # no stages
    rec = job_record(samples=[failed, *samples], concurrency=16, stages=[fast] * 98 + [slow, slow])
    warm = job_record(
        samples=[sample(5.0)], warmup=True, concurrency=16,
        stages=[{"client before sending": 5.0}],
    )  # fmt: skip
    (row,) = tail_rows([warm, rec])
    assert (row["n"], row["tail_n"]) == (100, 2)
    assert row["ttft_tail_ms"] == pytest.approx(42.0) and row["ttft_middle_ms"] == pytest.approx(
        12.0
    )
    assert row["client before sending"]["excess_ms"] == pytest.approx(30.0)
    assert row["engine step"]["excess_ms"] == pytest.approx(0.0)
    table = tail_markdown([row])
    assert "| stream-c16 | loopbridge | 42.0 / 12.0 | **+30.0** | " in table[-1]
    # A stage no request has (here: all but the two above) has no figure.
    assert table[-1].count("| n/a ") == len(STAGES) - 2
    # A group whose slowest lost no time in any stage has no bold cause.
    (quick,) = tail_rows([dataclasses.replace(rec, stages=[fast] * 100)])
    assert "**" not in tail_markdown([quick])[-1]
    assert tail_markdown([]) == []


@pytest.mark.vllm
@pytest.mark.timeout(480)
def test_own_loop_topology_with_the_stage_probe_end_to_end(tmp_path: Path) -> None:
    """The busy actor on a loop of its own, the engine on its own loop, every request
    marked at every stage: each request's stages add up to its TTFT, none negative."""
    out = tmp_path / "latency"
    cmd = [
        sys.executable,
        "-m",
        "loopbridge_bench.vllm",
        *("--requests", "4", "--concurrency", "2", "--rounds", "1", "--warmup-rounds", "0"),
        *("--output-len", "4", "--prompt-len", "8", "--step-ms", "1", "--stream", "on"),
        *("--busy", "own-loop", "--busy-slice-ms", "1", "--busy-period-ms", "5"),
        # The load starts with each job: a refit within its first millisecond.
        *("--refit-every-s", "0.001", "--refit-pause-ms", "1"),
        *("--modes", "per-hop,loopbridge,on-engine-loop", "--correctness", "off"),
        *("--stages", "on"),
        *("--switch-interval-ms", "1", "--no-plots", "--timeout", "30"),
        *("--cache-dir", str(REPO / ".cache"), "--out", str(out)),
    ]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "latency.json").read_text())
    meta = result["meta"]
    assert meta["switch_interval_ms"] == 1.0 and set(meta["load_average"]) == {"start", "end"}
    assert meta["busy_counters"]["slices"] > 0 and meta["busy_counters"]["refits"] > 0
    rows = {(r["scenario"], r["mode"]): r for r in result["rows"]}
    modes = ("per-hop", "loopbridge", "on-engine-loop")
    assert set(rows) == {("stream-c2-busy-own-loop", m) for m in modes}
    assert all(r["errors"] == 0 and r["own_loop"] for r in rows.values())
    for rec in result["records"]:
        assert len(rec["stages"]) == len(rec["samples"]) == 4
        for sample, stages in zip(rec["samples"], rec["stages"]):
            assert list(stages) == [name for name, _, _ in STAGES]  # every mark was made
            assert min(stages.values()) >= 0
            assert sum(stages.values()) == pytest.approx(sample["ttft"], abs=1e-6)
    stage_table = {(r["scenario"], r["mode"]) for r in result["stages"]}
    assert stage_table == set(rows)
    assert {(r["scenario"], r["mode"]) for r in result["stage_tail"]} == set(rows)
    report = (out / "latency.md").read_text()
    assert "Where the first token's time goes" in report
    assert "lose their time" in report
