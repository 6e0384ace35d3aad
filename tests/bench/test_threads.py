"""The serving process's threads per job (``loopbridge_bench.common.threads``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from loopbridge_bench.common.load import Sample
from loopbridge_bench.common.record import JobRecord
from loopbridge_bench.common.summary import summarize as summarize_with
from loopbridge_bench.common.threads import (
    ThreadTimes,
    job_threads,
    named_threads,
    per_request,
    snapshot,
    thread_lines,
)

from .records import job_record

HAS_SCHEDSTAT = Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat").exists()


def _task(
    root: Path, pid: int, tid: int, schedstat: str, voluntary: int, involuntary: int, sys: int
) -> None:
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (task / "schedstat").write_text(schedstat)
    # A command name with spaces and a bracket, as a thread may call itself.
    fields = ["S", *["0"] * 10, "70", str(sys), *["0"] * 30]
    (task / "stat").write_text(f"{tid} (py (worker) 1) {' '.join(fields)}\n")
    (task / "status").write_text(
        f"Name:\tpython\nvoluntary_ctxt_switches:\t{voluntary}\n"
        f"nonvoluntary_ctxt_switches:\t{involuntary}\n"
    )


def test_a_snapshot_reads_each_thread_and_names_it(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    _task(tmp_path, 100, 100, "2000000000 500000000 7\n", 40, 3, ticks // 2)
    _task(tmp_path, 100, 101, "1000000 0 1\n", 5, 0, 0)
    _task(tmp_path, 100, 102, "3000000 1000000 2\n", 6, 1, 0)
    broken = tmp_path / "100" / "task" / "103"
    broken.mkdir()  # ended between the listing and the read: no files
    (tmp_path / "100" / "task" / "103-not-a-tid").mkdir()
    got = snapshot(100, {101: "bench-engine-owner"}, root=str(tmp_path))
    assert got == {
        100: ("main", ThreadTimes(2.0, 0.5, 40, 3, (ticks // 2) / ticks)),
        101: ("bench-engine-owner", ThreadTimes(0.001, 0.0, 5, 0)),
        102: ("other", ThreadTimes(0.003, 0.001, 6, 1)),
    }
    # A process that is gone, or none: nothing, never zeros that look measured.
    assert snapshot(999, root=str(tmp_path)) == {}
    assert snapshot(None) == {}
    assert job_threads({}, got) == {} and job_threads(got, {}) == {}


def test_a_jobs_figures_are_differences_grouped_by_name() -> None:
    before = {
        1: ("main", ThreadTimes(1.0, 0.1, 10, 1, 0.5)),
        2: ("other", ThreadTimes(0.5, 0.0, 3, 0)),
        3: ("other", ThreadTimes(0.2, 0.0, 2, 0)),  # ended during the job
    }
    after = {
        1: ("main", ThreadTimes(1.25, 0.15, 16, 1, 0.75)),
        2: ("other", ThreadTimes(0.5, 0.25, 4, 2)),
        4: ("other", ThreadTimes(0.125, 0.0, 1, 0)),  # started during the job: from zero
        5: ("pool", ThreadTimes(0.0, 0.0, 0, 0)),
    }
    assert job_threads(before, after) == {
        "main": [0.25, pytest.approx(0.05), 6.0, 0.0, 0.25],
        "other": [0.125, 0.25, 2.0, 2.0, 0.0],
        "pool": [0.0, 0.0, 0.0, 0.0, 0.0],
    }
    # A counter never runs backwards into a negative figure (a reused tid).
    assert ThreadTimes(1.0, 1.0, 1, 1, 1.0) - ThreadTimes(2.0, 2.0, 2, 2, 2.0) == ThreadTimes()


@pytest.mark.skipif(
    not HAS_SCHEDSTAT,
    reason="needs Linux's per-thread scheduler statistics (/proc/<pid>/task/<tid>/schedstat)",
)
def test_a_real_thread_that_blocks_and_computes_shows_both() -> None:
    """A thread of this process, by its Python name: it blocks on a lock held by the
    main thread (voluntary switches) and computes (CPU time)."""
    held = threading.Lock()
    held.acquire()
    go, done, leave = threading.Event(), threading.Event(), threading.Event()

    def work() -> None:
        go.wait()
        for _ in range(5):
            held.acquire(timeout=0.001)  # held by the main thread: it blocks, then times out
        sum(i * i for i in range(200_000))
        done.set()
        leave.wait()  # stays alive for the second snapshot

    worker = threading.Thread(target=work, name="blocks-then-computes")
    worker.start()
    try:
        before = snapshot(os.getpid(), named_threads())
        go.set()
        done.wait()
        spent = job_threads(before, snapshot(os.getpid(), named_threads()))
    finally:
        go.set()
        leave.set()
        worker.join()
        held.release()
    cpu_s, wait_s, voluntary, involuntary, sys_s = spent["blocks-then-computes"]
    assert voluntary >= 5 and cpu_s > 0 and wait_s >= 0 and involuntary >= 0
    assert 0 <= sys_s <= cpu_s + 0.02  # ticks: up to two of 10 ms beyond the exact CPU
    assert "MainThread" in spent  # this process's main thread, by its Python name


def summarize(jobs: list[JobRecord]) -> list[dict[str, Any]]:
    return summarize_with(jobs, ("stock", "loopbridge"), ("stock",))


def _job(threads: dict[str, list[float]], ok: int = 10) -> JobRecord:
    samples = [
        Sample(start=0.0, ttft=0.01, e2e=0.05, tokens=4, error=None, itl=[0.01] * 3)
        for _ in range(ok)
    ]
    return job_record(samples=samples, threads=threads)


def test_the_report_gives_each_group_per_request_and_the_busiest_threads() -> None:
    jobs = [
        _job(
            {
                "http": [0.010, 0.002, 40.0, 2.0, 0.004],
                "owner": [0.020, 0.001, 30.0, 0.0, 0.0],
            }
        ),
        _job({"http": [0.010, 0.0, 20.0, 0.0, 0.0], "other": [0.001, 0.0, 10.0, 0.0, 0.0]}),
        _job({}),  # not measured (off Linux): left out, its requests too
    ]
    assert per_request([(j.threads, j.ok) for j in jobs]) == {
        "http": [0.001, 0.0001, 3.0, 0.1, 0.0002],
        "other": [0.00005, 0.0, 0.5, 0.0, 0.0],
        "owner": [0.001, 0.00005, 1.5, 0.0, 0.0],
    }
    (row,) = summarize(jobs)
    assert row["threads_per_request"]["http"] == [0.001, 0.0001, 3.0, 0.1, 0.0002]
    lines = thread_lines([row])
    assert lines[0] == "" and lines[1].startswith("The serving process's threads per request")
    assert lines[-1] == (
        "| stream-c2 | loopbridge | 2.05 (0.20) / 0.15 / 5.0 / 0.1 | http: 1.00 (0.20) / 0.10 / "
        "3.0 / 0.1; owner: 1.00 (0.00) / 0.05 / 1.5 / 0.0; other: 0.05 (0.00) / 0.00 / 0.5 / 0.0 |"
    )
    # No job measured: no figures, no table.
    (bare,) = summarize([_job({})])
    assert bare["threads_per_request"] == {} and thread_lines([bare]) == []


def test_both_benchmarks_reports_carry_the_table() -> None:
    from loopbridge_bench.sglang._report import markdown as sglang_markdown
    from loopbridge_bench.vllm._report import markdown as vllm_markdown

    jobs = [_job({"http": [0.010, 0.002, 40.0, 2.0, 0.0]})]
    for r in jobs:
        r.mode = "stock"
    ours = _job({"http": [0.020, 0.002, 40.0, 2.0, 0.01]})
    rows = summarize([*jobs, ours])
    line = (
        "| stream-c2 | loopbridge | 2.00 (1.00) / 0.20 / 4.0 / 0.2 | "
        "http: 2.00 (1.00) / 0.20 / 4.0 / 0.2 |"
    )
    meta = {"versions": {}, "python": "3", "prompt_len": 8, "output_len": 4, "argv": []}
    assert line in vllm_markdown(rows, {**meta, "requests": 10, "rounds": 1, "gpus": []})
    sglang = {"cpus": 2, "step_ms": 5, "warmup_rounds": 1, "requests": 10, "rounds": 1}
    assert line in sglang_markdown(rows, {**meta, **sglang})
