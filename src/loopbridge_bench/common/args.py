"""The load options both latency benchmarks share, with the same meaning in each.

``python -m loopbridge_bench.vllm`` and ``python -m loopbridge_bench.sglang`` describe
their workload the same way: how many requests, at which concurrencies, how long, streamed
or not, in how many rounds. Those options, their ``--quick`` defaults and the requests per
job are defined here once; each benchmark adds its own engine options around them.

Invariants: :func:`add_load_options` and :func:`add_round_options` add options in a fixed
order, with the same defaults and help text for both benchmarks; after
:func:`resolve_load_defaults`, ``concurrency`` and ``rounds`` are set and ``requests`` is
``None`` only outside ``--quick`` (then :func:`requests_for` scales it with concurrency).
"""

from __future__ import annotations

import argparse

__all__ = [
    "add_load_options",
    "add_round_options",
    "ints",
    "requests_for",
    "requests_meta",
    "resolve_load_defaults",
]

#: Concurrencies of a full run unless ``--concurrency`` says otherwise.
DEFAULT_CONCURRENCY = (1, 16, 64)
#: Requests per job under ``--quick`` unless ``--requests`` says otherwise.
QUICK_REQUESTS = 8
#: Requests per worker of a job outside ``--quick``, and the bounds of their product.
#: Sixteen closed-loop waves per job up to c = 64, so three rounds' pooled p99 has
#: about 8 samples above it at c = 16 and 30 at c = 64. The former 8 per worker within
#: 16..128 gave two waves at c = 64: a job's p99 was about its largest first token, and
#: the tail came and went between runs (docs/dev/performance-history.md, the sixth round).
PER_WORKER = 16
REQUESTS_BOUNDS = (16, 1024)
#: What ``meta["requests"]`` and ``--help`` say when ``--requests`` is not given.
REQUESTS_DEFAULT_TEXT = f"{PER_WORKER} per worker, {REQUESTS_BOUNDS[0]} to {REQUESTS_BOUNDS[1]}"


def ints(text: str) -> list[int]:
    """``--concurrency``: comma-separated positive integers."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_load_options(ap: argparse.ArgumentParser) -> None:
    """``--quick``, ``--requests``, ``--concurrency``, ``--prompt-len``, ``--output-len``
    and ``--stream``, in that order."""
    ap.add_argument(
        "--quick", action="store_true", help="a tiny run (smoke test): few requests, one round"
    )
    ap.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"requests per mode, scenario and round (default {REQUESTS_DEFAULT_TEXT})",
    )
    ap.add_argument(
        "--concurrency", type=ints, default=None, help="comma-separated (default 1,16,64)"
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


def add_round_options(
    ap: argparse.ArgumentParser, *, warmup_default: int | None, warmup_help: str
) -> None:
    """``--rounds`` and ``--warmup-rounds``; the warm-up's default is the benchmark's own
    (a number, or ``None`` when it depends on ``--quick``)."""
    ap.add_argument("--rounds", type=int, default=None, help="measured rounds (default 3)")
    ap.add_argument("--warmup-rounds", type=int, default=warmup_default, help=warmup_help)


def resolve_load_defaults(args: argparse.Namespace, *, quick_concurrency: list[int]) -> None:
    """Fill in what ``--quick`` changes: concurrencies, rounds and requests per job."""
    q = args.quick
    if args.concurrency is None:
        args.concurrency = list(quick_concurrency) if q else list(DEFAULT_CONCURRENCY)
    if args.rounds is None:
        args.rounds = 1 if q else 3
    if args.requests is None and q:
        args.requests = QUICK_REQUESTS


def requests_for(args: argparse.Namespace, c: int, warmup: bool) -> int:
    """Requests per job: ``--requests``, or :data:`PER_WORKER` per worker within
    :data:`REQUESTS_BOUNDS`.

    A warm-up job only needs every connection and code path used once or twice: a
    quarter of that, at least one per worker.
    """
    low, high = REQUESTS_BOUNDS
    n: int = args.requests if args.requests is not None else max(low, min(high, PER_WORKER * c))
    return min(n, max(c, n // 4)) if warmup else n


def requests_meta(args: argparse.Namespace) -> int | str:
    """``meta["requests"]``: the fixed count, or how the default scales."""
    return args.requests if args.requests is not None else REQUESTS_DEFAULT_TEXT
