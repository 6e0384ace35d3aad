"""Command line: ``python -m loopbridge_vllm serve MODEL [options] [-- vllm serve options]``.

``serve`` builds an ``AsyncLLM`` on a dedicated owner-loop thread and serves
vLLM's OpenAI app from a second thread through the loop-safe proxy. The main
thread only handles signals: SIGINT or SIGTERM stops the server first, then the
engine, then the owner loop. The first line on stdout is
``serving on http://HOST:PORT`` (with the actual port when ``--port 0``).

``--cpu-standin`` runs the real engine on a machine without a GPU, with the
stand-in forward pass of :mod:`loopbridge_vllm.cpu_engine` (tests, demos).

``bench`` runs the latency benchmark (``python -m loopbridge_bench.vllm``) when the
loopbridge-bench distribution is installed; the adapter never imports it otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
from collections.abc import Sequence
from typing import Any

from loopbridge import LoopThread
from loopbridge_adapters.body_limit import DEFAULT_MAX_BODY_BYTES
from loopbridge_adapters.serve_cli import (
    Delegate,
    UsageError,
    add_listen_options,
    add_loop_options,
    listen_conflicts,
    listen_on,
    run_subcommand,
    server_loop_options,
)
from loopbridge_adapters.serve_lifecycle import ServeCommand, Serving

# Subcommands another distribution provides: name -> its module and what to install.
_DELEGATED = {
    "bench": Delegate(
        "loopbridge_bench.vllm",
        "loopbridge-bench[vllm] (in a checkout of loopbridge: pip install -e './bench[vllm]')",
    )
}

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

    @property
    def uds(self) -> str | None:
        return self.ns.uds or None


def _plan(opts: argparse.Namespace, vllm_argv: list[str]) -> _Plan:
    """The ``vllm serve`` namespace and where to listen; :class:`_UsageError` if refused."""
    from loopbridge_vllm._library_options import ServeOptionError, quiet
    from loopbridge_vllm._serve_options import given_options, refusals
    from loopbridge_vllm._vllm_releases.moved_imports import serve_arg_checks
    from loopbridge_vllm.server import _make_parser, import_parser_plugins

    parser = _make_parser()
    if not any(a in ("-h", "--help") for a in vllm_argv):  # help prints, as stock's
        # An unknown option or a bad value: one line, not vLLM's whole usage.
        quiet(parser, "after '--'")
    try:
        ns = parser.parse_args(["--model", opts.model, *vllm_argv])
        given = given_options(quiet(_make_parser(), "after '--'"), vllm_argv)
    except ServeOptionError as exc:
        raise UsageError(str(exc)) from exc
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


class _Serve(ServeCommand[_Plan]):
    owner_name = "loopbridge-engine-owner"

    def parser(self) -> argparse.ArgumentParser:
        return _serve_parser()

    def prepare(self, opts: argparse.Namespace, engine_argv: list[str]) -> list[str] | int:
        if not opts.cpu_standin:
            return engine_argv
        from loopbridge_vllm._cpu_platform import registration_problem
        from loopbridge_vllm.cpu_engine import STANDIN_BACKEND, cpu_engine_env

        cpu_engine_env()
        problem = registration_problem()
        if problem is not None:
            print(f"error: --cpu-standin: {problem}", file=sys.stderr, flush=True)
            return 2
        return [
            "--distributed-executor-backend",
            STANDIN_BACKEND,
            "--dtype",
            "float32",
            "--enforce-eager",
            *engine_argv,
        ]

    def plan(self, opts: argparse.Namespace, engine_argv: list[str]) -> _Plan:
        return _plan(opts, engine_argv)

    def bound(self, opts: argparse.Namespace, plan: _Plan, sock: socket.socket) -> None:
        from vllm.utils.system_utils import set_ulimit

        set_ulimit()  # as vllm serve: many concurrent connections need many descriptors

    async def build(self, opts: argparse.Namespace, plan: _Plan) -> Any:
        return await _build_engine(plan.ns)

    def start(
        self,
        opts: argparse.Namespace,
        plan: _Plan,
        engine: Any,
        owner: LoopThread,
        sock: socket.socket,
    ) -> Serving:
        from loopbridge_vllm.server import start_openai_server

        return start_openai_server(
            engine,
            host=plan.host,
            port=plan.port,
            args=plan.ns,
            grace=plan.grace,
            log_level=plan.ns.uvicorn_log_level,
            **server_loop_options(opts),
            metrics=opts.metrics,
            max_body_bytes=opts.max_body_bytes or None,
            sock=sock,
        )

    def stop_server(self, server: Any) -> None:
        server.stop(shutdown_engine=False)

    def stop_engine(self, engine: Any, owner: LoopThread) -> None:
        from loopbridge_vllm.engine import shutdown_engine

        shutdown_engine(engine)


def serve(argv: Sequence[str]) -> int:
    return _Serve().run(argv)


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
