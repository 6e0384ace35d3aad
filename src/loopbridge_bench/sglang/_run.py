"""The benchmark's command line and rounds: ``python -m loopbridge_bench.sglang``.

Every round runs each scenario (streaming and non-streaming ``/generate`` at each
concurrency) once per mode, the mode order rotating with the round and the scenario so
drift and warm-up hit both modes alike. Each job gets requests no other job sent
(:mod:`loopbridge_bench.common.load`), the same lengths for both modes of a round
and scenario, and a server of its own (:meth:`Stack.serving`). Before the first
measured job, both modes' ``/model_info`` must agree (:meth:`Stack.check_same`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopbridge_bench.common.args import (
    add_load_options,
    add_round_options,
    requests_for,
    requests_meta,
    resolve_load_defaults,
)
from loopbridge_bench.common.console import Console
from loopbridge_bench.common.gc_clock import GcClock, settle
from loopbridge_bench.common.load import Job, LoadProcess
from loopbridge_bench.common.record import (
    Cell,
    JobRecord,
    job_seed,
    rounds,
    scenario_key,
    versions,
)
from loopbridge_bench.common.summary import summarize
from loopbridge_bench.common.threads import job_threads, named_threads, snapshot

from ._report import markdown, target_checks, terminal_report
from ._stack import MODES, Stack

__all__ = ["main", "parse_args", "requests_for", "run"]

#: The baseline: the threaded mode is compared with SGLang's own topology.
BASELINES = ("stock",)
_ENDPOINT = "generate"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m loopbridge_bench.sglang",
        description=(
            "Latency of SGLang's own HTTP app over a real TokenizerManager (stand-in "
            "scheduler, real ZMQ messages), driven over real HTTP on kept-alive "
            "connections: stock (the app on the manager's own loop, as launch_server "
            "runs it) against loopbridge (the app on its own thread, the manager "
            "through its proxy), interleaved in one run."
        ),
    )
    add_load_options(ap)
    add_round_options(ap, warmup_default=None, warmup_help="unmeasured rounds first (default 1)")
    ap.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="the stand-in scheduler's step, one token per running request (default 5)",
    )
    ap.add_argument(
        "--timeout", type=float, default=120.0, help="per-request timeout, s (default 120)"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("results/sglang-latency"),
        help="where latency.json and latency.md go (default results/sglang-latency)",
    )
    ap.add_argument(
        "--show-logs",
        action="store_true",
        help="leave SGLang's and uvicorn's logs on the terminal instead of <out>/logs/",
    )
    ap.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the GC unfrozen after set-up (launch_server freezes it after warm-up) and "
        "the run's records unfrozen between jobs",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    resolve_load_defaults(args, quick_concurrency=[1, 4])
    q = args.quick
    if args.warmup_rounds is None:
        args.warmup_rounds = 0 if q else 1
    if args.step_ms is None:
        args.step_ms = 1.0 if q else 5.0
    if q:
        args.output_len = min(args.output_len, 8)
    for name, low in (
        ("requests", 1),
        ("rounds", 1),
        ("warmup_rounds", 0),
        ("prompt_len", 4),
        ("output_len", 1),
    ):
        value = getattr(args, name)
        if value is not None and value < low:
            ap.error(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    if args.step_ms < 0 or args.timeout <= 0:
        ap.error("--step-ms must be at least 0 and --timeout above 0")
    if args.prompt_len + args.output_len >= 2048:
        ap.error("--prompt-len + --output-len must stay below the tiny model's 2048 positions")
    args.argv = list(argv if argv is not None else sys.argv[1:])
    return args


def _streams(args: argparse.Namespace) -> list[bool]:
    return {"both": [True, False], "on": [True], "off": [False]}[args.stream]


def _report_config(url: str) -> dict[str, Any]:
    """What a server says about its model: the configuration check's input."""
    import httpx

    out: dict[str, Any] = {}
    for path in ("/model_info",):
        resp = httpx.get(url + path, timeout=30)
        resp.raise_for_status()
        out[path] = resp.json()
    return out


def run(args: argparse.Namespace, console: Console | None = None) -> dict[str, Any]:
    """The run; ``console`` routes its logs to files (none: they stay where they are)."""
    console = console or Console(None)
    scenarios = [(stream, c) for stream in _streams(args) for c in args.concurrency]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    records: list[JobRecord] = []
    next_id = 0
    t_start = time.perf_counter()
    load_start = list(os.getloadavg())
    console.phase("sglang")
    stack = Stack(args.step_ms / 1e3, freeze_gc=args.gc_freeze)
    gc_clock = GcClock()
    load = LoadProcess()
    partial = (out / "latency.partial.jsonl").open("w")
    config: dict[str, Any] = {}
    try:
        stack.start()
        reports = {}
        for mode in MODES:
            with stack.serving(mode) as url:
                reports[mode] = _report_config(url)
        config = stack.check_same(reports)
        cells = rounds(scenarios, MODES, rounds=args.rounds, warmup_rounds=args.warmup_rounds)
        for cell in cells:
            for mode in cell.modes:
                rec = _job(args, console, stack, load, gc_clock, cell, mode, next_id)
                next_id += len(rec.samples)
                records.append(rec)
                partial.write(json.dumps(rec.as_json()) + "\n")
                partial.flush()
                if args.gc_freeze:
                    settle()  # the records so far: never walked during a later job
                if rec.engine_died:
                    raise RuntimeError(
                        f"the manager or its stand-in died during {mode}; see {console.current}"
                    )
    finally:
        gc_clock.close()
        partial.close()
        load.close()
        stack.stop()
    rows = summarize(records, MODES, BASELINES)
    meta: dict[str, Any] = {
        "engine": "SGLang's TokenizerManager with the stand-in scheduler",
        "model": "tiny (config only, skip_tokenizer_init)",
        "config": config,
        "step_ms": args.step_ms,
        "gc_frozen": args.gc_freeze,
        "gc_full_collections": int(sum(r.extra["gc_full"] for r in records if not r.warmup)),
        "gc_full_s": sum(r.extra["gc_full_s"] for r in records if not r.warmup),
        "stream": args.stream,
        "endpoint": "/generate",
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "requests": requests_meta(args),
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "modes": list(MODES),
        "keepalive": "one connection per worker, opened before the clock starts",
        "prompts_sent": next_id,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": {"start": load_start, "end": list(os.getloadavg())},
        "versions": _versions(),
        "elapsed_s": time.perf_counter() - t_start,
        "argv": list(args.argv),
    }
    return {"meta": meta, "rows": rows, "targets": target_checks(rows), "records": records}


def _job(
    args: argparse.Namespace,
    console: Console,
    stack: Stack,
    load: LoadProcess,
    gc_clock: GcClock,
    cell: Cell[tuple[bool, int]],
    mode: str,
    first_id: int,
) -> JobRecord:
    """One mode's job of ``cell``, measured: its record."""
    stream, c = cell.scenario
    n = requests_for(args, c, cell.warmup)
    console.say(
        f"round {cell.round + 1}/{args.warmup_rounds + args.rounds}"
        f"{' (warm-up)' if cell.warmup else ''} {scenario_key(stream, c, False)} {mode}"
    )
    with stack.serving(mode) as url:
        job = Job(
            url=url,
            model="",
            requests=n,
            concurrency=c,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            stream=stream,
            timeout_s=args.timeout,
            seed=job_seed(args.seed, cell),
            first_id=first_id,
            endpoint=_ENDPOINT,
        )
        threads0 = snapshot(os.getpid(), named_threads())
        cpu0, gc0 = time.process_time(), gc_clock.snapshot()
        wall, samples, client_cpu = load.run(job)
        cpu = time.process_time() - cpu0
        threads = job_threads(threads0, snapshot(os.getpid(), named_threads()))
        gc_full, gc_full_s = gc_clock.since(gc0)
    return JobRecord(
        round=cell.round,
        warmup=cell.warmup,
        mode=mode,
        stream=stream,
        concurrency=c,
        wall_s=wall,
        samples=samples,
        server_cpu_s=cpu,
        client_cpu_s=client_cpu,
        threads=threads,
        engine_died=not stack.healthy,
        endpoint=_ENDPOINT,
        # Full (generation 2) collections in this process during the job.
        extra={"gc_full": gc_full, "gc_full_s": gc_full_s},
    )


def _versions() -> dict[str, str]:
    return versions("sglang", "torch", "uvicorn", "uvloop", "fastapi", "aiohttp")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    log_dir = None if args.show_logs else args.out / "logs"
    with Console(log_dir) as console:
        if log_dir is not None:
            console.say(f"bench: logs go to {log_dir}/")
        result = run(args, console)
        (args.out / "latency.json").write_text(
            json.dumps(
                {
                    "meta": result["meta"],
                    "rows": result["rows"],
                    "targets": result["targets"],
                    "records": [rec.as_json() for rec in result["records"]],
                },
                indent=1,
                default=str,
            )
        )
        (args.out / "latency.md").write_text(markdown(result["rows"], result["meta"]) + "\n")
        for line in terminal_report(result["rows"], result["meta"]):
            print(line, file=console.out)
        print(
            f"\nwrote {args.out / 'latency.json'} and {args.out / 'latency.md'}",
            file=console.out,
        )
    return result
