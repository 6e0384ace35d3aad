"""Command line and orchestration of the latency benchmark."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loopbridge_bench.common.args import requests_for, requests_meta
from loopbridge_bench.common.console import Console, tail
from loopbridge_bench.common.gc_clock import GcClock, settle
from loopbridge_bench.common.load import (
    OPENAI_ENDPOINTS,
    Job,
    LoadProcess,
    Sample,
    length_bounds,
    request_lengths,
)
from loopbridge_bench.common.record import Cell, JobRecord, job_seed, rounds, versions
from loopbridge_bench.common.threads import job_threads, named_threads, snapshot

from ._args import BUSY_CHOICES, MODES, OWNER_LOOPS, parse_args, prefix_caching
from ._correctness import Outcome, correctness_markdown, run_correctness, verdict_lines
from ._devices import Gpu, Placement, detect_gpus, place_engines, startup_order
from ._report import (
    headlines,
    markdown,
    plot,
    scenario_key,
    summarize,
    target_checks,
    terminal_report,
)
from ._stack import BusyLoad, EngineSpec, Stack, engine_args, prepare_model
from ._stages import StageProbe, stage_rows, stages_markdown, stages_of, tail_markdown, tail_rows
from ._stock import StockServer, check_stock_argv, stock_argv

#: Two engines' KV-cache sizes (tokens) may differ by this much and still be compared.
KV_TOLERANCE = 0.01
#: vLLM's default KV-cache block size, for the stated hit rate before an engine reports its own.
DEFAULT_BLOCK_SIZE = 16

__all__ = ["MODES", "main", "parse_args", "prefix_caching", "requests_for", "run"]


@dataclass(frozen=True)
class Scenario:
    """One workload: closed loop at ``concurrency``, or open loop at ``rate_fraction``."""

    stream: bool
    concurrency: int  # closed loop: workers; open loop: most connections
    busy: bool
    endpoint: str = "completions"
    rate_fraction: float | None = None  # of stock's measured capacity
    own_loop: bool = False  # busy: the actor's loop, while the engine has its own

    @property
    def key(self) -> str:
        return scenario_key(
            self.stream,
            self.concurrency,
            self.busy,
            self.endpoint,
            self.rate_fraction,
            self.own_loop,
        )

    @property
    def workload(self) -> str:
        """The requests it serves: its idle twin's key (a busy scenario replays the
        twin's lengths and arrivals in each round, so the two differ by the load alone)."""
        return replace(self, busy=False, own_loop=False).key


def _endpoints(args: argparse.Namespace) -> list[str]:
    return list(OPENAI_ENDPOINTS) if args.endpoint == "both" else [args.endpoint]


def _scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The closed-loop scenarios, in the order they run in each round."""
    stream = {"on": [True], "off": [False], "both": [True, False]}[args.stream]
    return [
        Scenario(st, c, b, ep, own_loop=own)
        for b, own in BUSY_CHOICES[args.busy]
        for ep in _endpoints(args)
        for st in stream
        for c in args.concurrency
    ]


def _open_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The open-loop sweep: every closed-loop workload but concurrency, at each fraction."""
    conns = 2 * args.max_num_seqs  # never the client's limit: the server queues the rest
    seen = dict.fromkeys((s.stream, s.busy, s.endpoint, s.own_loop) for s in _scenarios(args))
    return [
        Scenario(st, conns, b, ep, f, own) for (st, b, ep, own) in seen for f in args.rate_fractions
    ]


def _capacity_scenario(args: argparse.Namespace, sc: Scenario) -> Scenario:
    """The closed-loop scenario whose request rate is the capacity ``sc`` is a fraction of."""
    return Scenario(sc.stream, max(args.concurrency), sc.busy, sc.endpoint, own_loop=sc.own_loop)


def _spec(args: argparse.Namespace) -> EngineSpec:
    return EngineSpec(
        model=args.model,
        cache_dir=args.cache_dir.resolve(),
        step_s=args.step_ms / 1e3,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len or 0,
        engine_args=tuple(args.engine_arg),
        prefix_caching=prefix_caching(args),
        log_stats=args.stages == "on",
    )


def _placed(spec: EngineSpec, placement: Placement) -> EngineSpec:
    """``spec`` on the devices and memory share of ``placement``."""
    eargs = dict(spec.engine_args)
    if placement.gpu_memory_utilization is not None:
        eargs["gpu_memory_utilization"] = placement.gpu_memory_utilization
    return replace(spec, engine_args=tuple(eargs.items()), env=tuple(placement.env.items()))


def plan_devices(args: argparse.Namespace, gpus: list[Gpu]) -> dict[str, Placement]:
    """Each engine's devices and memory share (none for the CPU stand-in)."""
    order = startup_order(args.modes, args.correctness == "on")
    user = dict(args.engine_arg).get("gpu_memory_utilization")
    if args.model is None:
        gpus = []  # the stand-in runs on CPU
    try:
        return place_engines(gpus, order, args.tensor_parallel_size, user)
    except ValueError as exc:
        raise SystemExit(f"bench: {exc}") from None


def expected_hit_rate(jobs: list[Job], block_size: int) -> float:
    """Prompt tokens a prefix cache serves, over all prompt tokens (the first request's included).

    vLLM caches whole blocks and always computes a prompt's last token, so a
    request reuses ``floor(min(prefix, prompt - 1) / block) * block`` tokens.
    """
    cached = total = 0
    for job in jobs:
        for i in range(job.requests):
            n, _ = request_lengths(job, i)
            cached += min(job.shared_prefix, n - 1) // block_size * block_size
            total += n
    return cached / total if total else 0.0


def check_kv(kv: dict[str, dict[str, Any]]) -> float | None:
    """The relative difference of stock's and the threaded stack's KV-cache sizes.

    ``None`` when either is unknown.  Raises ``RuntimeError`` above
    :data:`KV_TOLERANCE`: the engines would not be the same engine.
    """
    a = (kv.get("stock") or {}).get("tokens")
    b = (kv.get("threaded") or {}).get("tokens")
    if not a or not b:
        return None
    diff = float(abs(a - b) / max(a, b))
    if diff > KV_TOLERANCE:
        raise RuntimeError(
            f"the engines' KV caches differ by {diff:.1%} (stock {a} tokens, threaded {b}); "
            f"more than {KV_TOLERANCE:.0%} makes their latencies incomparable. Pin both with "
            "--engine-arg num_gpu_blocks_override=N, or give each engine its own GPUs"
        )
    return diff


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """Everything up to starting engines: the model, the engine args, the stock command.

    The engine arguments are built by the code the real run uses and the stock
    command line is parsed by vLLM's own ``serve`` parser, so a renamed vLLM
    option or import fails here, on any machine, instead of on the GPU.  The
    device placement and start-up order are those the real run uses, for the
    GPUs visible here or the ``--fake-gpus`` list.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    gpus: list[Gpu] = (
        args.fake_gpus if args.fake_gpus is not None else (detect_gpus() if args.model else [])
    )
    placement = plan_devices(args, gpus)
    order = startup_order(args.modes, args.correctness == "on")
    spec = _placed(_spec(args), placement[order[-1]])
    model_dir = prepare_model(spec)
    platform_note = "as the real run"
    if spec.model is not None and "VLLM_TARGET_DEVICE" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            # vLLM's parser needs a platform to fill in its defaults; without a
            # GPU it would refuse to guess one.
            os.environ["LOOPBRIDGE_CPU_PLATFORM"] = "1"  # see loopbridge_vllm._cpu_platform
            platform_note = "cpu (no GPU here: the parser's device defaults are the CPU's)"
    eargs = engine_args(spec, model_dir)
    from vllm.v1.engine.async_llm import AsyncLLM  # the class the real run builds

    argv = stock_argv(eargs, "127.0.0.1", 8000)
    parsed = check_stock_argv(argv, eargs)
    closed, open_ = _scenarios(args), _open_scenarios(args)
    plan = {
        "model": str(model_dir),
        "engine": "local model" if args.model is not None else "CPU stand-in executor",
        "engine_class": f"{AsyncLLM.__module__}.{AsyncLLM.__qualname__}",
        "platform": platform_note,
        "engine_args": _shown(eargs, sorted({*_PLAN_FIELDS, *dict(spec.engine_args)})),
        "stock_command": ["vllm", "serve", *argv],
        "stock_parsed": _shown(parsed, ["model", "dtype", *_PLAN_FIELDS[1:]]),
        "gpus": [asdict(g) for g in gpus],
        "startup_order": order,
        "placement": {e: _placement_json(placement[e]) for e in order},
        "prefix_cache": {
            "enabled": prefix_caching(args),
            "shared_prefix_tokens": args.shared_prefix,
            "block_size": f"{DEFAULT_BLOCK_SIZE} (vLLM's default; the run reads the engine's)",
        },
        "modes": list(args.modes),
        "scenarios": [_planned(args, sc) for sc in closed + open_],
        "out": str(args.out),
        "versions": _versions(),
    }
    return plan


#: The engine settings a dry run shows (beside those ``--engine-arg`` set).
_PLAN_FIELDS = (
    "model",
    "max_num_seqs",
    "max_model_len",
    "distributed_executor_backend",
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "tensor_parallel_size",
)


def _shown(obj: Any, fields: Sequence[str]) -> dict[str, str]:
    return {k: repr(getattr(obj, k)) for k in fields if hasattr(obj, k)}


def _planned(args: argparse.Namespace, sc: Scenario) -> dict[str, Any]:
    """A scenario as a dry run lists it."""
    c = max(args.concurrency) if sc.rate_fraction is not None else sc.concurrency
    return {
        "key": sc.key,
        "stream": sc.stream,
        "concurrency": sc.concurrency,
        "busy": sc.busy,
        "own_loop": sc.own_loop,
        "endpoint": sc.endpoint,
        "rate_fraction": sc.rate_fraction,
        "requests": requests_for(args, c, False),
    }


def _placement_json(p: Placement) -> dict[str, Any]:
    return {
        "CUDA_VISIBLE_DEVICES": None if p.devices is None else ",".join(p.devices),
        "gpu_memory_utilization": p.gpu_memory_utilization,
        "shared_devices": p.shared,
    }


#: The log files of a run, under ``OUT/logs/`` (see ``docs/dev/performance-history.md``).
SETUP_LOG = "setup"  # this process while it builds the model
THREADED_LOG = "latency-threaded"  # the latency engine and its threaded servers
STOCK_LOG = "stock-server.log"  # `vllm serve` and its EngineCore


def run(args: argparse.Namespace, console: Console | None = None) -> dict[str, Any]:
    """The run; ``console`` routes its logs to files (none: they stay where they are)."""
    # vLLM logs every engine step detail at INFO; keep the logs to what matters.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    r = _Run(args, console or Console(None))
    try:
        r.start_engines()
        r.bar.reset(total=r.total)  # start the clock (and the rate) after start-up
        for cell in rounds(r.closed, r.modes, rounds=args.rounds, warmup_rounds=args.warmup_rounds):
            r.measure(cell, 0.0)
        r.open_loop()
    finally:
        r.close()
    return r.result()


class _Run:
    """One run's engines, servers and load generator, and what it has measured so far."""

    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.args, self.console = args, console
        self.spec = _spec(args)
        self.load = BusyLoad(
            slice_s=args.busy_slice_ms / 1e3,
            period_s=args.busy_period_ms / 1e3,
            work=args.busy_work,
            refit_every_s=args.refit_every_s,
            refit_pause_s=args.refit_pause_ms / 1e3,
        )
        self.modes: list[str] = args.modes
        self.closed, self.open_ = _scenarios(args), _open_scenarios(args)
        self.total = _total_requests(args, self.closed + self.open_)
        self.order = startup_order(self.modes, args.correctness == "on")
        self.gpus = detect_gpus() if args.model is not None else []
        self.placement = plan_devices(args, self.gpus)
        self.records: list[JobRecord] = []
        self.outcomes: list[Outcome] = []
        self.events: list[dict[str, Any]] = []
        self.kv: dict[str, dict[str, Any]] = {}
        self.kv_diff: float | None = None
        self.jobs: list[Job] = []
        self.capacity: dict[str, float] = {}
        self.next_id = 0  # the run-wide number of the next request: every prompt is unique
        self.race_s = 0.0
        self.bar = _progress(self.total, args.progress, console.err)
        self.t_start = time.perf_counter()
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        # One line per finished job, so a crash of the process under test (the
        # unsafe mode can abort it) keeps what was measured so far.
        self.partial = (self.out / "latency.partial.jsonl").open("w")
        console.phase(SETUP_LOG)
        model_dir = prepare_model(self.spec)  # also the environment both engines inherit
        self.stock: StockServer | None = None
        if "stock" in self.modes:
            eargs = engine_args(_placed(self.spec, self.placement["stock"]), model_dir)
            self.stock = StockServer(eargs, (console.log_dir or self.out) / STOCK_LOG)
            check_stock_argv(self.stock.argv, eargs)  # before anything starts: same engine
        self.load_proc = LoadProcess()
        self.gc_clock = GcClock()
        self.probe = StageProbe().install() if args.stages == "on" else None
        threaded = tuple(m for m in self.modes if m != "stock")
        spec = _placed(self.spec, self.placement["threaded"]) if threaded else self.spec
        ms = args.switch_interval_ms
        self.stack = Stack(
            spec,
            threaded,
            self.probe,
            None if ms is None else ms / 1e3,
            OWNER_LOOPS[args.owner_loop],
        )
        # While the threaded servers serve: theirs, or (off) the interpreter's as it is.
        self.switch_ms = sys.getswitchinterval() * 1e3 if ms is None else ms
        self.load_avg = {"start": list(os.getloadavg())}

    def note(self, text: str) -> None:
        self.bar.write(text, file=self.console.err)

    def event(self, engine: str, what: str) -> None:
        t = time.perf_counter() - self.t_start
        self.events.append({"engine": engine, "event": what, "t_s": t})

    # -- engines ------------------------------------------------------------------
    def start_engines(self) -> None:
        """One engine at a time: each is ready (the correctness engine: gone) before the
        next starts, so no engine profiles memory while another allocates or frees it."""
        for engine in self.order:
            self.event(engine, "start")
            if engine == "correctness":
                self._correctness()
                self.event(engine, "stopped")
                continue
            if engine == "stock" and self.stock is not None:
                self._start_stock()
            elif engine == "threaded":
                self.console.phase(THREADED_LOG)
                self.bar.set_description("starting engine and servers")
                self.stack.start()
                self.kv[engine] = self.stack.kv_cache()
            self.event(engine, "ready")
        self.kv_diff = check_kv(self.kv)

    def _correctness(self) -> None:
        args = self.args
        self.bar.set_description("correctness phase (race amplifier)")
        t_race = time.perf_counter()
        self.outcomes = run_correctness(
            _placed(self.spec, self.placement["correctness"]),
            self.load_proc,
            requests=args.race_requests,
            concurrency=args.race_concurrency,
            timeout_s=min(args.timeout, 30.0),
            first_id=self.next_id,
            kv=self.kv.setdefault("correctness", {}),
            log=self.console.phase,
        )
        self.next_id += 2 * args.race_requests
        self.race_s = time.perf_counter() - t_race

    def _start_stock(self) -> None:
        assert self.stock is not None
        self.console.phase(THREADED_LOG)  # this process's side, while vllm serve starts
        self.bar.set_description("starting vllm serve")
        env = dict(os.environ, **self.placement["stock"].env)
        env["VLLM_LOGGING_LEVEL"] = "INFO"  # its log states its KV-cache size
        self.stock.start(env)
        self.console.add(self.stock.log_path)
        self.stock.wait_ready(self.args.stock_timeout)
        self.kv["stock"] = self.stock.kv_cache()

    # -- jobs ---------------------------------------------------------------------
    def measure(self, cell: Cell[Scenario], rate: float) -> None:
        """Every mode of one round and scenario, in the cell's order."""
        sc, args = cell.scenario, self.args
        top = max(args.concurrency)
        n = requests_for(args, sc.concurrency if sc.rate_fraction is None else top, cell.warmup)
        for mode in cell.modes:
            warm = " (warm-up)" if cell.warmup else ""
            total = args.warmup_rounds + args.rounds
            self.bar.set_description(f"round {cell.round + 1}/{total}{warm} {sc.key} {mode}")
            # The busy load starts with each threaded mode's job, so every mode meets
            # its CPU slices and refit pauses at the same times from its first request
            # (started once per cell, the pauses fell on whichever mode ran then).
            # ``stock`` is another process: nothing to load.
            busy = sc.busy and mode != "stock"
            if busy:
                self.stack.set_busy(busy_load_of(self.load, self.args.seed, cell), sc.own_loop)
            try:
                self._job(cell, mode, n, rate)
            finally:
                if busy:
                    self.stack.set_busy(None)
            self.bar.update(n)

    def _job(self, cell: Cell[Scenario], mode: str, n: int, rate: float) -> None:
        sc, args, stock = cell.scenario, self.args, self.stock
        job = Job(
            url=stock.url if mode == "stock" and stock else self.stack.url(mode),
            model=self.stack.served_name,
            requests=n,
            concurrency=sc.concurrency,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            stream=sc.stream,
            timeout_s=args.timeout,
            # Lengths and arrivals: the same for every mode of a round and scenario,
            # and for a busy scenario and its idle twin.
            seed=job_seed(args.seed, cell, sc.workload),
            first_id=self.next_id,
            lengths=args.lengths,
            shared_prefix=args.shared_prefix,
            endpoint=sc.endpoint,
            rate=rate,
        )
        self.next_id += n
        self.jobs.append(job)
        pid = _server_pid(mode, stock)
        threads0 = snapshot(pid, named_threads())
        cpu0, gc0 = _server_cpu(mode, stock), self.gc_clock.snapshot()
        wall, samples, client_cpu = self.load_proc.run(job)
        cpu = _server_cpu(mode, stock) - cpu0
        threads = job_threads(threads0, snapshot(pid, named_threads()))
        gc_full, gc_full_s = self.gc_clock.since(gc0)
        died = (stock is None or not stock.alive) if mode == "stock" else not self.stack.healthy
        probe = self.probe
        ok = [s for s in samples if s.error is None]
        rec = JobRecord(
            round=cell.round,
            warmup=cell.warmup,
            mode=mode,
            stream=sc.stream,
            concurrency=sc.concurrency,
            wall_s=wall,
            samples=samples,
            server_cpu_s=cpu,
            client_cpu_s=client_cpu,
            threads=threads,
            engine_died=died,
            busy=sc.busy,
            own_loop=sc.own_loop,
            endpoint=sc.endpoint,
            rate_fraction=sc.rate_fraction,
            offered_rps=rate or None,
            # Stock: the client's own stage only (its server is another process).
            stages=_stages(probe, ok) if probe is not None else [],
            # Full collections in this process during the job (stock's: not its server's).
            extra={"gc_full": gc_full, "gc_full_s": gc_full_s},
        )
        self.records.append(rec)
        self.partial.write(json.dumps(rec.as_json()) + "\n")
        self.partial.flush()
        if args.gc_freeze:
            settle()  # the records so far: never walked by a collection during a later job
        if died:
            self._died(mode, sc)

    def _died(self, mode: str, sc: Scenario) -> None:
        if mode == "stock":
            log = self.stock.log_path if self.stock else None
            last = "\n".join(f"  | {line}" for line in tail(log))
            raise RuntimeError(f"vllm serve exited during the run; the end of {log}:\n{last}")
        if mode == "unsafe":
            # Its race, without the amplifier: possible, so reported, not fatal.
            self.note(
                f"unsafe: the raw engine died during {sc.key} (the race, unprovoked); "
                f"restarting the stack; see {self.console.current or 'the output above'}"
            )
        else:
            self.note(f"UNEXPECTED: the engine died during {mode} ({sc.key}); restarting the stack")
            for line in tail(self.console.current, 15):
                self.note(f"  | {line}")
        self.stack.restart()

    def open_loop(self) -> None:
        """The open-loop sweep, at fractions of the capacity the closed loop measured."""
        if not self.open_:
            return
        args, modes = self.args, self.modes
        base = "stock" if "stock" in modes else modes[0]
        for sc in self.open_:
            cap = _capacity_scenario(args, sc)
            rates = [
                r.ok / r.wall_s
                for r in self.records
                if not r.warmup and r.mode == base and r.wall_s > 0 and r.key == cap.key
            ]
            if rates:
                self.capacity[cap.key] = statistics.median(rates)
            else:
                self.note(f"no capacity measured for {cap.key} ({base}); skipping {sc.key}")
        cells = rounds(
            self.open_,
            modes,
            rounds=args.rounds,
            warmup_rounds=args.warmup_rounds,
            first_index=len(self.closed),
        )
        for cell in cells:
            cap_rps = self.capacity.get(_capacity_scenario(args, cell.scenario).key)
            if cap_rps:
                self.measure(cell, cap_rps * (cell.scenario.rate_fraction or 0.0))

    # -- the end ------------------------------------------------------------------
    def close(self) -> None:
        self.bar.close()
        self.partial.close()
        self.stack.stop()
        if self.stock is not None:
            self.stock.stop()
        self.load_proc.close()
        self.gc_clock.close()
        if self.probe is not None:
            self.probe.uninstall()
        self.load_avg["end"] = list(os.getloadavg())

    def result(self) -> dict[str, Any]:
        rows = summarize(self.records)
        return {
            "meta": _meta(self),
            "rows": rows,
            "stages": stage_rows(self.records),
            "stage_tail": tail_rows(self.records),
            "targets": target_checks(rows),
            "headlines": headlines(rows),
            "correctness": self.outcomes,
            "records": self.records,
        }


def busy_load_of(load: BusyLoad, seed: int, cell: Cell[Any]) -> BusyLoad:
    """The busy load of ``cell``'s jobs: its first refit at a time drawn from the cell's
    seed, within one refit period, so every mode of the cell meets it at the same
    offset into its job and the offsets of different cells are independent."""
    rng = random.Random(f"refit:{job_seed(seed, cell)}")
    return replace(load, first_refit_s=rng.uniform(0.0, load.refit_every_s))


def _total_requests(args: argparse.Namespace, scenarios: list[Scenario]) -> int:
    """Requests of the whole run (every round, scenario and mode): the progress bar's total."""
    top = max(args.concurrency)
    return sum(
        requests_for(
            args, sc.concurrency if sc.rate_fraction is None else top, rnd < args.warmup_rounds
        )
        * len(args.modes)
        for rnd in range(args.warmup_rounds + args.rounds)
        for sc in scenarios
    )


def _engine_name(args: argparse.Namespace) -> str:
    if args.real_cpu:
        return "vLLM's CPU worker (real forward pass), tiny model"
    if args.model is not None:
        return "local model"
    return "vLLM AsyncLLM with the CPU stand-in executor"


def _meta(r: _Run) -> dict[str, Any]:
    """What ``latency.json`` says about the run besides its figures: a declarative table."""
    args, stock, kv = r.args, r.stock, r.kv
    measured = [rec for rec in r.records if not rec.warmup and rec.mode != "stock"]
    block = int((kv.get("threaded") or kv.get("correctness") or {}).get("block_size") or 0)
    return {
        "engine": _engine_name(args),
        "model": str(args.model) if args.model is not None else "tiny (stand-in)",
        "step_ms": args.step_ms if args.model is None else None,
        "stream": args.stream,
        "endpoint": args.endpoint,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "lengths": args.lengths,
        "length_bounds": {
            "prompt": length_bounds(args.prompt_len, args.lengths),
            "output": length_bounds(args.output_len, args.lengths),
        },
        "max_model_len": args.max_model_len,
        "requests": requests_meta(args),
        "concurrency": args.concurrency,
        "rate_fractions": args.rate_fractions,
        "capacity_rps": r.capacity,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "modes": r.modes,
        "keepalive": "one connection per worker, opened before the clock starts",
        "stock_command": None if stock is None else ["vllm", "serve", *stock.argv],
        "stock_vllm_version": None if stock is None else stock.version,
        "gpus": [asdict(g) for g in r.gpus],
        "tensor_parallel_size": args.tensor_parallel_size,
        "placement": {e: _placement_json(r.placement[e]) for e in r.order},
        "startup": r.events,
        "kv_cache": kv,
        "kv_cache_difference": r.kv_diff,
        "prefix_cache": {
            "enabled": prefix_caching(args),
            "shared_prefix_tokens": args.shared_prefix,
            "block_size": block or None,
            "expected_hit_rate": expected_hit_rate(r.jobs, block) if block else None,
        },
        "prompts_sent": r.next_id,
        "correctness": {
            "requests": args.race_requests,
            "concurrency": args.race_concurrency,
            "elapsed_s": r.race_s,  # its own engine's start-up and shutdown included
            "outcomes": [o.as_json() for o in r.outcomes],
        },
        "busy_load": asdict(r.load),
        "busy_counters": dict(r.stack.busy_counters),
        "engine_restarts": r.stack.restarts,
        "max_num_seqs": args.max_num_seqs,
        "load_average": r.load_avg,
        "switch_interval_ms": r.switch_ms,
        "owner_loop": r.stack.owner_kind,
        "stages": args.stages,
        "gc_frozen_between_jobs": args.gc_freeze,
        # In this process during the measured jobs of the threaded modes.
        "gc_full_collections": int(sum(r.extra["gc_full"] for r in measured)),
        "gc_full_s": sum(r.extra["gc_full_s"] for r in measured),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": _versions(),
        "elapsed_s": time.perf_counter() - r.t_start,
        "argv": list(args.argv),
    }


def _stages(probe: StageProbe, samples: list[Sample]) -> list[dict[str, float]]:
    """Each sample's stage times (:func:`~._stages.stages_of`), its server marks taken."""
    marks = probe.take([s.number for s in samples])
    out = []
    for s in samples:
        m = dict(marks.get(s.number, {}), sent=s.sent_at, first=s.sent_at + s.ttft)
        if s.written_at:
            m["written"] = s.written_at
        out.append(stages_of(m))
    return out


def _server_pid(mode: str, stock: StockServer | None) -> int | None:
    """The process that serves ``mode``'s HTTP requests: ``vllm serve``'s for stock
    (its threads have no names here: :mod:`loopbridge_bench.common.threads`), this
    one for the threaded modes."""
    if mode == "stock":
        return stock.server_pid() if stock is not None else None
    return os.getpid()


def _server_cpu(mode: str, stock: StockServer | None) -> float:
    """CPU seconds so far of the process that serves ``mode``'s HTTP requests.

    ``stock``: the ``vllm serve`` process (its EngineCore not included); the
    threaded modes: this process (their HTTP threads and the engine owner
    loop, with the busy load when a scenario has one).
    """
    if mode == "stock":
        return stock.cpu_seconds() if stock is not None else 0.0
    return time.process_time()


def _versions() -> dict[str, str]:
    return versions("vllm", "aiohttp", "uvicorn", "torch")


class _NoBar:
    def set_description(self, text: str) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def reset(self, total: int) -> None:
        pass

    def write(self, text: str, file: Any = None) -> None:
        print(text, file=file or sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool, file: Any) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, unit="req", dynamic_ncols=True, file=file)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        plan = dry_run(args)
        print(json.dumps(plan, indent=1))
        print("dry run: nothing started", file=sys.stderr)
        return plan
    out: Path = args.out
    console = Console(None if args.show_logs else out / "logs")
    if console.log_dir is not None:
        print(
            f"bench: engine and server logs go to {console.log_dir}/, one file per phase "
            "(--show-logs: on the terminal instead)",
            file=sys.stderr,
        )
    with console:
        result = run(args, console)
        # Plotting and writing may warn too: still into the log of the last phase.
        meta = result["meta"]
        outcomes: list[Outcome] = result.pop("correctness")
        written = []
        if outcomes:
            race = correctness_markdown(outcomes, meta)
            (out / "correctness.json").write_text(
                json.dumps({"meta": meta, "outcomes": [o.as_json() for o in outcomes]}, indent=1)
            )
            (out / "correctness.md").write_text(race + "\n")
            written += [out / "correctness.json", out / "correctness.md"]
        records = [rec.as_json() for rec in result["records"]]
        (out / "latency.json").write_text(json.dumps(dict(result, records=records), indent=1))
        stage_table = "\n".join(
            stages_markdown(result["stages"]) + tail_markdown(result["stage_tail"])
        )
        (out / "latency.md").write_text(markdown(result["rows"], meta) + stage_table + "\n")
        written += [out / "latency.json", out / "latency.md"]
        if args.plots:
            plots_dir: Path = args.plots_dir or out
            plots_dir.mkdir(parents=True, exist_ok=True)
            kinds = {"both": "streaming and not", "on": "streaming", "off": "non-streaming"}
            title = f"{kinds[args.stream]}, {args.output_len} output tokens"
            written += plot(result["records"], result["rows"], plots_dir, title, meta)
    # The report, on the terminal: verdicts, the table, where everything is.
    lines = verdict_lines(outcomes)
    if lines:
        lines.append("")
    lines += terminal_report(result["rows"], meta)
    lines += stages_markdown(result["stages"]) + tail_markdown(result["stage_tail"])
    lines += ["", f"wrote ({meta['elapsed_s']:.0f} s): {', '.join(map(str, written))}"]
    if console.logs:
        lines.append(f"logs: {', '.join(map(str, console.logs))}")
    print("\n".join(lines), flush=True)
    return result
