"""Command line and orchestration of the latency benchmark."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ._correctness import Outcome, correctness_markdown, run_correctness
from ._load import Job, LoadProcess
from ._report import markdown, plot, summarize, target_checks
from ._stack import THREADED_MODES, BusyLoad, EngineSpec, Stack, engine_args, prepare_model
from ._stock import StockServer, check_stock_argv, stock_argv

MODES = ("stock", *THREADED_MODES)
#: Each engine's share of GPU memory when ``stock`` runs beside the threaded stack.
STOCK_SHARED_GPU_SHARE = 0.4

__all__ = ["main", "parse_args", "run"]


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _modes(text: str) -> list[str]:
    vals = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in vals if v not in MODES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"modes must be from {', '.join(MODES)}; got {text!r}")
    return vals


def _engine_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    return key.replace("-", "_"), parsed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m loopbridge_vllm.bench",
        description=(
            "Latency of vLLM's OpenAI server on its own thread, driven over real HTTP on "
            "kept-alive connections, with the engine reached three ways: unsafe (raw "
            "AsyncLLM), per-hop (one run_coroutine_threadsafe hop per output) and "
            "loopbridge; all against stock `vllm serve` over the same engine configuration. "
            "A short correctness phase (the race made certain) runs first."
        ),
    )
    ap.add_argument(
        "--quick", action="store_true", help="a tiny run (smoke test): few requests, one round"
    )
    ap.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests per mode, scenario and round (default 8 per worker, 16 to 128)",
    )
    ap.add_argument(
        "--concurrency", type=_ints, default=None, help="comma-separated (default 1,16,64)"
    )
    ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
    ap.add_argument(
        "--output-len", type=int, default=32, help="output tokens per request (default 32)"
    )
    ap.add_argument(
        "--stream",
        choices=("both", "on", "off"),
        default="both",
        help="streaming requests, non-streaming ones, or both as separate scenarios (default)",
    )
    ap.add_argument(
        "--no-stream", dest="stream", action="store_const", const="off", help="= --stream off"
    )
    ap.add_argument("--rounds", type=int, default=None, help="measured rounds (default 3)")
    ap.add_argument("--warmup-rounds", type=int, default=1, help="discarded rounds (default 1)")
    ap.add_argument("--modes", type=_modes, default=list(MODES), help=f"default {','.join(MODES)}")
    ap.add_argument(
        "--busy",
        choices=("off", "on", "both"),
        default="off",
        help="busy-owner scenarios (default off)",
    )
    ap.add_argument(
        "--busy-slice-ms", type=float, default=4.0, help="CPU slice on the owner loop (default 4)"
    )
    ap.add_argument(
        "--busy-period-ms", type=float, default=10.0, help="one slice per period (default 10)"
    )
    ap.add_argument(
        "--refit-every-s",
        type=float,
        default=1.0,
        help="pause/resume cycle period, 0 = none (default 1)",
    )
    ap.add_argument("--refit-pause-ms", type=float, default=50.0, help="pause length (default 50)")
    ap.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="stand-in engine step time, emulating a GPU (default 5)",
    )
    ap.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a local Hugging Face model directory: real model (GPU)",
    )
    ap.add_argument(
        "--engine-arg",
        type=_engine_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra AsyncEngineArgs (repeatable; VALUE is JSON or a string)",
    )
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="engine batch limit (default: max concurrency)",
    )
    ap.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="default 512 on the stand-in, the model's own otherwise",
    )
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".cache"),
        help="tiny model and vLLM cache (default ./.cache)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("results/latency"),
        help="output directory (default ./results/latency)",
    )
    ap.add_argument(
        "--timeout", type=float, default=120.0, help="per-request timeout in seconds (default 120)"
    )
    ap.add_argument(
        "--plots-dir", type=Path, default=None, help="where the PNG plots go (default: --out)"
    )
    ap.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    ap.add_argument(
        "--correctness",
        choices=("on", "off"),
        default="on",
        help="the race phase before the latency rounds (default on)",
    )
    ap.add_argument(
        "--race-requests", type=int, default=64, help="requests per mode in that phase (default 64)"
    )
    ap.add_argument("--race-concurrency", type=int, default=16, help="its concurrency (default 16)")
    ap.add_argument(
        "--stock-timeout",
        type=float,
        default=600.0,
        help="seconds for `vllm serve` to come up (default 600)",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve the model, build and check the engine arguments and the stock "
        "command line, print them, start nothing",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    q = args.quick
    if args.concurrency is None:
        args.concurrency = [4] if q else [1, 16, 64]
    if args.rounds is None:
        args.rounds = 1 if q else 3
    if args.step_ms is None:
        args.step_ms = 1.0 if q else 5.0
    if args.requests is None and q:
        args.requests = 8
    for name in ("rounds", "prompt_len", "output_len", "race_requests", "race_concurrency"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.requests is not None and args.requests < 1:
        ap.error("--requests must be at least 1")
    if args.warmup_rounds < 0:
        ap.error("--warmup-rounds must be >= 0")
    if args.model is not None and not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
    if args.max_num_seqs is None:
        args.max_num_seqs = max([*args.concurrency, args.race_concurrency])
    keys = {k for k, _ in args.engine_arg}
    if args.model is not None and "stock" in args.modes and "gpu_memory_utilization" not in keys:
        # Two engines share the device (ours and stock's), each taking its share
        # at start-up: vLLM's default share (0.92) would leave none for the other.
        args.engine_arg.append(("gpu_memory_utilization", STOCK_SHARED_GPU_SHARE))
    if args.max_model_len is None and args.model is None:
        args.max_model_len = 512
    if args.max_model_len is not None and args.prompt_len + args.output_len > args.max_model_len:
        ap.error("--prompt-len + --output-len exceed --max-model-len")
    return args


def requests_for(args: argparse.Namespace, c: int, warmup: bool) -> int:
    """Requests per job: ``--requests``, or 8 per worker within 16..128.

    A warm-up job only needs every connection and code path used once or twice.
    """
    n: int = args.requests if args.requests is not None else max(16, min(128, 8 * c))
    return min(n, max(c, n // 4)) if warmup else n


def _scenarios(args: argparse.Namespace) -> list[tuple[bool, int, bool]]:
    busy = {"off": [False], "on": [True], "both": [False, True]}[args.busy]
    stream = {"on": [True], "off": [False], "both": [True, False]}[args.stream]
    return [(st, c, b) for b in busy for st in stream for c in args.concurrency]


def _spec(args: argparse.Namespace) -> EngineSpec:
    return EngineSpec(
        model=args.model,
        cache_dir=args.cache_dir.resolve(),
        step_s=args.step_ms / 1e3,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len or 0,
        engine_args=tuple(args.engine_arg),
    )


def dry_run(args: argparse.Namespace) -> dict[str, Any]:
    """Everything up to starting engines: the model, the engine args, the stock command.

    The engine arguments are built by the code the real run uses and the stock
    command line is parsed by vLLM's own ``serve`` parser, so a renamed vLLM
    option or import fails here, on any machine, instead of on the GPU.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    spec = _spec(args)
    model_dir = prepare_model(spec)
    platform_note = "as the real run"
    if spec.model is not None and "VLLM_TARGET_DEVICE" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            # vLLM's parser needs a platform to fill in its defaults; without a
            # GPU it would refuse to guess one.
            os.environ["VLLM_TARGET_DEVICE"] = "cpu"
            platform_note = "cpu (no GPU here: the parser's device defaults are the CPU's)"
    eargs = engine_args(spec, model_dir)
    from vllm.v1.engine.async_llm import AsyncLLM  # the class the real run builds

    argv = stock_argv(eargs, "127.0.0.1", 8000)
    parsed = check_stock_argv(argv, eargs)
    plan = {
        "model": str(model_dir),
        "engine": "local model" if args.model is not None else "CPU stand-in executor",
        "engine_class": f"{AsyncLLM.__module__}.{AsyncLLM.__qualname__}",
        "platform": platform_note,
        "engine_args": {
            k: repr(getattr(eargs, k))
            for k in sorted(
                {
                    "model",
                    *dict(spec.engine_args),
                    "max_num_seqs",
                    "max_model_len",
                    "distributed_executor_backend",
                    "gpu_memory_utilization",
                }
            )
            if hasattr(eargs, k)
        },
        "stock_command": ["vllm", "serve", *argv],
        "stock_parsed": {
            k: repr(getattr(parsed, k))
            for k in (
                "model",
                "dtype",
                "max_num_seqs",
                "distributed_executor_backend",
                "gpu_memory_utilization",
            )
            if hasattr(parsed, k)
        },
        "modes": list(args.modes),
        "scenarios": [
            {"stream": st, "concurrency": c, "busy": b, "requests": requests_for(args, c, False)}
            for st, c, b in _scenarios(args)
        ],
        "out": str(args.out),
        "versions": _versions(),
    }
    return plan


def run(args: argparse.Namespace) -> dict[str, Any]:
    # vLLM logs every engine step detail at INFO; keep the progress bar readable.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    spec = _spec(args)
    load = BusyLoad(
        slice_s=args.busy_slice_ms / 1e3,
        period_s=args.busy_period_ms / 1e3,
        refit_every_s=args.refit_every_s,
        refit_pause_s=args.refit_pause_ms / 1e3,
    )
    modes: list[str] = args.modes
    threaded = tuple(m for m in modes if m != "stock")
    scenarios = _scenarios(args)
    total_rounds = args.warmup_rounds + args.rounds
    total = sum(
        requests_for(args, c, rnd < args.warmup_rounds) * len(modes)
        for rnd in range(total_rounds)
        for _, c, _ in scenarios
    )
    records: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    race_s = 0.0
    bar = _progress(total, args.progress)
    t_start = time.perf_counter()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # One line per finished job, so a crash of the process under test (the
    # unsafe mode can abort it) keeps what was measured so far.
    partial = (out / "latency.partial.jsonl").open("w")
    model_dir = prepare_model(spec)  # also the environment both servers' engines inherit
    stock = None
    if "stock" in modes:
        eargs = engine_args(spec, model_dir)
        stock = StockServer(eargs, out / "stock-server.log")
        check_stock_argv(stock.argv, eargs)  # before anything starts: same engine, known flags
    load_proc = LoadProcess()
    stack = Stack(spec, threaded)
    try:
        if stock is not None:
            # It starts in the background (about as long as our engine) while the
            # correctness phase and the threaded stack come up.
            stock.start(dict(os.environ))
        if args.correctness == "on":
            bar.set_description("correctness phase (race amplifier)")
            t_race = time.perf_counter()
            outcomes = run_correctness(
                spec,
                load_proc,
                requests=args.race_requests,
                concurrency=args.race_concurrency,
                timeout_s=min(args.timeout, 30.0),
            )
            race_s = time.perf_counter() - t_race
        bar.set_description("starting engine and servers")
        if threaded:
            stack.start()
        if stock is not None:
            bar.set_description("waiting for vllm serve")
            stock.wait_ready(args.stock_timeout)
        bar.reset(total=total)  # start the clock (and the rate) after start-up
        for rnd in range(total_rounds):
            warm = rnd < args.warmup_rounds
            for si, (stream, c, busy) in enumerate(scenarios):
                stack.set_busy(load if busy else None)
                n = requests_for(args, c, warm)
                # Rotate the mode order every round and scenario: drift and
                # warm-up effects hit every mode alike.
                k = (rnd + si) % len(modes)
                for mode in modes[k:] + modes[:k]:
                    bar.set_description(
                        f"round {rnd + 1}/{total_rounds}{' (warm-up)' if warm else ''} "
                        f"{'stream' if stream else 'no-stream'} c={c}{' busy' if busy else ''} {mode}"
                    )
                    job = Job(
                        url=stock.url if mode == "stock" and stock else stack.url(mode),
                        model=stack.served_name,
                        requests=n,
                        concurrency=c,
                        prompt_len=args.prompt_len,
                        output_len=args.output_len,
                        stream=stream,
                        timeout_s=args.timeout,
                        seed=args.seed + rnd * 1000 + si * 10,
                    )
                    wall, samples = load_proc.run(job)
                    if mode == "stock":
                        died = stock is None or not stock.alive
                    else:
                        died = not stack.healthy
                    ok = [s for s in samples if s.error is None]
                    records.append(
                        {
                            "round": rnd,
                            "warmup": warm,
                            "stream": stream,
                            "concurrency": c,
                            "busy": busy,
                            "mode": mode,
                            "wall_s": wall,
                            "ok": len(ok),
                            "tokens": sum(s.tokens for s in ok),
                            "engine_died": died,
                            "samples": [asdict(s) for s in samples],
                        }
                    )
                    partial.write(json.dumps(records[-1]) + "\n")
                    partial.flush()
                    bar.update(n)
                    if died and mode == "stock":
                        raise RuntimeError(
                            f"vllm serve exited during the run; see {stock.log_path if stock else '-'}"
                        )
                    if died:
                        bar.write(f"engine died during {mode} (c={c}); restarting the stack")
                        stack.restart()
                        if busy:
                            stack.set_busy(load)
                stack.set_busy(None)
    finally:
        bar.close()
        partial.close()
        stack.stop()
        if stock is not None:
            stock.stop()
        load_proc.close()
    elapsed = time.perf_counter() - t_start
    rows = summarize(records)
    meta: dict[str, Any] = {
        "engine": "local model"
        if args.model is not None
        else "vLLM AsyncLLM with the CPU stand-in executor",
        "model": str(args.model) if args.model is not None else "tiny (stand-in)",
        "step_ms": args.step_ms if args.model is None else None,
        "stream": args.stream,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "requests": args.requests if args.requests is not None else "8 per worker, 16..128",
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "modes": modes,
        "keepalive": "one connection per worker, opened before the clock starts",
        "stock_command": None if stock is None else ["vllm", "serve", *stock.argv],
        "stock_vllm_version": None if stock is None else stock.version,
        "correctness": {
            "requests": args.race_requests,
            "concurrency": args.race_concurrency,
            "elapsed_s": race_s,  # its own engine's start-up and shutdown included
            "outcomes": [o.as_json() for o in outcomes],
        },
        "busy_load": asdict(load),
        "busy_counters": dict(stack.busy_counters),
        "engine_restarts": stack.restarts,
        "max_num_seqs": args.max_num_seqs,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": _versions(),
        "elapsed_s": elapsed,
        "argv": list(args.argv),
    }
    return {
        "meta": meta,
        "rows": rows,
        "targets": target_checks(rows),
        "correctness": outcomes,
        "records": records,
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("loopbridge", "vllm", "httpx", "uvicorn", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


class _NoBar:
    def set_description(self, text: str) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def reset(self, total: int) -> None:
        pass

    def write(self, text: str) -> None:
        print(text, file=sys.stderr)

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, unit="req", dynamic_ncols=True, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        plan = dry_run(args)
        print(json.dumps(plan, indent=1))
        print("dry run: nothing started", file=sys.stderr)
        return plan
    result = run(args)
    out: Path = args.out
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
        print(race + "\n")
    table = markdown(result["rows"], meta)
    (out / "latency.json").write_text(json.dumps(result, indent=1))
    (out / "latency.md").write_text(table + "\n")
    written += [out / "latency.json", out / "latency.md"]
    if args.plots:
        plots_dir: Path = args.plots_dir or out
        plots_dir.mkdir(parents=True, exist_ok=True)
        kinds = {"both": "streaming and not", "on": "streaming", "off": "non-streaming"}
        title = f"{kinds[args.stream]}, {args.output_len} output tokens"
        written += plot(result["records"], result["rows"], plots_dir, title, meta)
    print(table)
    print(f"\nwrote {', '.join(map(str, written))} ({meta['elapsed_s']:.0f} s)")
    return result
