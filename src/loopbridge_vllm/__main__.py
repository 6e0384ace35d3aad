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
import errno
import gc
import importlib
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from loopbridge_vllm._body_limit import DEFAULT_MAX_BODY_BYTES

# Subcommands implemented in other modules: name -> module with main(argv).
_DELEGATED = {"bench": "loopbridge_vllm.bench"}
_SUBCOMMANDS = ("serve", *_DELEGATED)


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loopbridge_vllm serve",
        description="Serve vLLM's OpenAI API from a thread, with AsyncLLM on its own loop.",
        epilog="Options after '--' go to vLLM's `vllm serve` parser (engine and frontend).",
    )
    parser.add_argument("model", help="model path or name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument(
        "--cpu-standin",
        action="store_true",
        help="run on CPU with the stand-in forward pass (loopbridge_vllm.cpu_engine)",
    )
    parser.add_argument("--grace", type=float, default=5.0, help="drain time on shutdown (s)")
    parser.add_argument("--uvloop", action="store_true", help="use uvloop for the owner loop")
    parser.add_argument(
        "--no-server-uvloop",
        dest="server_uvloop",
        action="store_false",
        help="run the HTTP server's loop on asyncio instead of uvloop (default: uvloop if installed)",
    )
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


def serve(argv: Sequence[str]) -> int:
    argv = list(argv)
    vllm_argv: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, vllm_argv = argv[:cut], argv[cut + 1 :]
    opts = _serve_parser().parse_args(argv)
    from loopbridge_vllm.server import _bind

    # Bind before the engine is built: a busy port is known in milliseconds,
    # not after the engine's start-up.
    try:
        sock = _bind(opts.host, opts.port)
    except OSError as exc:
        print(_bind_failure(opts.host, opts.port, exc), file=sys.stderr, flush=True)
        return 1
    if opts.cpu_standin:
        from loopbridge_vllm.cpu_engine import STANDIN_BACKEND, cpu_engine_env

        cpu_engine_env()
        vllm_argv = [
            "--distributed-executor-backend",
            STANDIN_BACKEND,
            "--dtype",
            "float32",
            "--enforce-eager",
            *vllm_argv,
        ]

    from loopbridge import LoopThread
    from loopbridge_vllm.server import _make_parser, start_openai_server

    ns = _make_parser().parse_args(["--model", opts.model, *vllm_argv])

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Signals are the main thread's business; neither the owner loop nor the
    # server thread installs handlers.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    owner = LoopThread("loopbridge-engine-owner", use_uvloop=opts.uvloop).start()
    engine: Any = None
    server: Any = None
    try:
        engine = owner.run(_build_engine, ns)
        server = start_openai_server(
            engine,
            host=opts.host,
            port=opts.port,
            args=ns,
            grace=opts.grace,
            use_uvloop=opts.server_uvloop,
            metrics=opts.metrics,
            max_body_bytes=opts.max_body_bytes or None,
            sock=sock,
        )
        print(f"serving on {server.url}", flush=True)
        while not stop.wait(0.2):
            if not server.thread.is_alive():
                reason = server.exit_reason.value if server.exit_reason else "unknown"
                print(f"server stopped by itself ({reason})", flush=True)
                break
        code = 0 if stop.is_set() else 1
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
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _bind_failure(host: str, port: int, exc: OSError) -> str:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"error: port {port} is already in use ({where}): stop the process that "
            "listens on it, or choose another port with --port (0 picks a free one)"
        )
    return f"error: cannot listen on {where}: {exc.strerror or exc}; check --host and --port"


async def _build_engine(ns: argparse.Namespace) -> Any:
    # Runs on the owner loop, so the engine's output handler starts there.
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(ns))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        print("subcommands: " + ", ".join(_SUBCOMMANDS))
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        return serve(rest)
    target = _DELEGATED.get(command)
    if target is None:
        known = ", ".join(_SUBCOMMANDS)
        print(f"unknown subcommand {command!r} (known: {known})", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name != target:
            raise
        print(f"subcommand {command!r} is not available in this installation", file=sys.stderr)
        return 2
    result = module.main(rest)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
