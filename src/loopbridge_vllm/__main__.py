"""Command line: ``python -m loopbridge_vllm serve MODEL [options] [-- vllm serve options]``.

``serve`` builds an ``AsyncLLM`` on a dedicated owner-loop thread and serves
vLLM's OpenAI app from a second thread through the loop-safe proxy. The main
thread only handles signals: SIGINT or SIGTERM stops the server first, then the
engine, then the owner loop. The first line on stdout is
``serving on http://HOST:PORT`` (with the actual port when ``--port 0``).

``--cpu-standin`` runs the real engine on a machine without a GPU, with the
stand-in forward pass of :mod:`loopbridge_vllm.cpu_engine` (tests, demos).

``bench`` runs the latency benchmark (:mod:`loopbridge_vllm.bench`, same as
``python -m loopbridge_vllm.bench``). The data-parallel tools are a separate
entry point: ``python -m loopbridge_vllm.dp``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import sys
from collections.abc import Sequence
from typing import Any

from loopbridge_adapters.serve_cli import (
    StopSignals,
    UsageError,
    add_listen_options,
    add_loop_options,
    bind_failure,
    listen_conflicts,
    listen_on,
    report_usage_error,
    run_subcommand,
    serve_until_stopped,
)
from loopbridge_vllm._body_limit import DEFAULT_MAX_BODY_BYTES

# Subcommands implemented in other modules: name -> module with main(argv).
_DELEGATED = {"bench": "loopbridge_vllm.bench"}

_DEFAULT_HOST = "127.0.0.1"
_DEFAULT_PORT = 8000
_DEFAULT_GRACE = 5.0


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loopbridge_vllm serve",
        description="Serve vLLM's OpenAI API from a thread, with AsyncLLM on its own loop.",
        epilog="Options after '--' go to vLLM's `vllm serve` parser (engine and frontend).",
    )
    parser.add_argument("model", help="model path or name")
    add_listen_options(parser, _DEFAULT_HOST, _DEFAULT_PORT)
    parser.add_argument(
        "--cpu-standin",
        action="store_true",
        help="run on CPU with the stand-in forward pass (loopbridge_vllm.cpu_engine)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=None,
        help=f"drain time on shutdown (s), like vLLM's --shutdown-timeout (default: {_DEFAULT_GRACE})",
    )
    add_loop_options(parser, "uvloop if installed")
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="answer 413 to request bodies larger than this; 0: no limit, as vllm serve "
        "(default: %(default)s, 32 MiB)",
    )
    parser.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_false",
        help="don't export loopbridge's series on /metrics nor monitor the owner loop's lag",
    )
    return parser


_UsageError = UsageError  # the name the tests and earlier releases use


@dataclasses.dataclass
class _Plan:
    ns: argparse.Namespace  # the `vllm serve` namespace the engine and the app get
    host: str
    port: int
    grace: float


def _plan(opts: argparse.Namespace, vllm_argv: list[str]) -> _Plan:
    """The ``vllm serve`` namespace and where to listen; :class:`_UsageError` if refused."""
    from loopbridge_vllm._serve_options import given_options, refusals
    from loopbridge_vllm._vllm_releases.moved_imports import serve_arg_checks
    from loopbridge_vllm.server import _make_parser, import_parser_plugins

    parser = _make_parser()
    given = given_options(_make_parser(), vllm_argv)
    ns = parser.parse_args(["--model", opts.model, *vllm_argv])
    # One source of truth for each setting: given twice is an error, not a choice.
    problems = listen_conflicts(opts, given)
    for dest in ("model_tag", "model"):
        if dest in given:
            problems.append(
                f"the model is given twice ({opts.model!r} and {getattr(ns, dest)!r} after "
                "'--'); give it once, as MODEL"
            )
    if "uds" in given and (opts.host is not None or opts.port is not None):
        problems.append("--uds listens on a Unix socket: drop --host and --port")
    if opts.grace is not None and "shutdown_timeout" in given:
        problems.append("--grace and --shutdown-timeout both set the drain on shutdown; give one")
    problems += refusals(parser, ns, given)
    if problems:
        raise UsageError("\n".join(problems))
    validate_parsed, validate_api, _ = serve_arg_checks()
    # vllm serve's own checks, in its order: the command line, then (after the
    # parser plugins registered their names) the parser names.
    try:
        validate_parsed(ns)
        import_parser_plugins(ns)
        validate_api(ns)
    except (ValueError, TypeError, KeyError) as exc:
        message = str(exc.args[0] if exc.args else exc)
        raise UsageError(message.removeprefix("Error: ")) from exc
    host, port = listen_on(opts, ns, given, _DEFAULT_HOST, _DEFAULT_PORT)
    ns.host, ns.port = host, port  # the namespace the app sees tells the truth
    if opts.grace is not None:
        grace = opts.grace
    elif "shutdown_timeout" in given:
        grace = float(ns.shutdown_timeout)
    else:
        grace = _DEFAULT_GRACE
    return _Plan(ns, host, port, grace)


def serve(argv: Sequence[str]) -> int:
    argv = list(argv)
    vllm_argv: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, vllm_argv = argv[:cut], argv[cut + 1 :]
    opts = _serve_parser().parse_args(argv)
    if opts.cpu_standin:
        from loopbridge_vllm._cpu_platform import registration_problem
        from loopbridge_vllm.cpu_engine import STANDIN_BACKEND, cpu_engine_env

        cpu_engine_env()
        problem = registration_problem()
        if problem is not None:
            print(f"error: --cpu-standin: {problem}", file=sys.stderr, flush=True)
            return 2
        vllm_argv = [
            "--distributed-executor-backend",
            STANDIN_BACKEND,
            "--dtype",
            "float32",
            "--enforce-eager",
            *vllm_argv,
        ]
    try:
        plan = _plan(opts, vllm_argv)
    except UsageError as exc:
        return report_usage_error(exc)
    ns = plan.ns
    from vllm.utils.system_utils import set_ulimit

    from loopbridge_vllm.server import _bind, _bind_unix

    # Bind before the engine is built: a busy port is known in milliseconds,
    # not after the engine's start-up.
    try:
        sock = _bind_unix(ns.uds) if ns.uds else _bind(plan.host, plan.port)
    except OSError as exc:
        print(bind_failure(plan.host, plan.port, ns.uds, exc), file=sys.stderr, flush=True)
        return 1
    set_ulimit()  # as vllm serve: many concurrent connections need many descriptors

    from loopbridge import LoopThread
    from loopbridge_vllm.server import start_openai_server

    # Signals are the main thread's business; neither the owner loop nor the
    # server thread installs handlers.
    signals = StopSignals().install()
    owner = LoopThread("loopbridge-engine-owner", use_uvloop=opts.uvloop).start()
    engine: Any = None
    server: Any = None
    try:
        engine = owner.run(_build_engine, ns)
        server = start_openai_server(
            engine,
            host=plan.host,
            port=plan.port,
            args=ns,
            grace=plan.grace,
            log_level=ns.uvicorn_log_level,
            use_uvloop=opts.server_uvloop,
            metrics=opts.metrics,
            max_body_bytes=opts.max_body_bytes or None,
            sock=sock,
        )
        print(f"serving on {server.url}", flush=True)
        code = serve_until_stopped(signals.stop, server)
    finally:
        if server is not None:
            server.stop(shutdown_engine=False)
            print("server stopped", flush=True)
        else:
            sock.close()
        if engine is not None:
            from loopbridge_vllm.engine import shutdown_engine

            shutdown_engine(engine)
            print("engine stopped", flush=True)
        # Drop the engine while the interpreter is intact: AsyncLLM.__del__ shuts
        # down again, which fails during interpreter teardown.
        engine = server = None
        gc.collect()
        owner.stop()
        signals.restore()
        if ns.uds:
            with contextlib.suppress(OSError):
                os.unlink(ns.uds)
    return code


async def _build_engine(ns: argparse.Namespace) -> Any:
    # Runs on the owner loop, so the engine's output handler starts there. Built
    # as vllm serve builds it: the API server's usage context, the same logging
    # switches, the same fix-up of the engine arguments.
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from loopbridge_vllm._vllm_releases.moved_imports import serve_arg_checks

    engine_args = AsyncEngineArgs.from_cli_args(ns)
    serve_arg_checks()[2](ns, engine_args)
    context = UsageContext.OPENAI_API_SERVER
    llm = AsyncLLM.from_vllm_config(
        engine_args.create_engine_config(usage_context=context),
        usage_context=context,
        enable_log_requests=engine_args.enable_log_requests,
        aggregate_engine_logging=engine_args.aggregate_engine_logging,
        disable_log_stats=engine_args.disable_log_stats,
    )
    await llm.reset_mm_cache()  # as vllm serve: drop the profiling run's dummy inputs
    return llm


def main(argv: Sequence[str] | None = None) -> int:
    return run_subcommand(sys.argv[1:] if argv is None else argv, __doc__, serve, _DELEGATED)


if __name__ == "__main__":
    sys.exit(main())
