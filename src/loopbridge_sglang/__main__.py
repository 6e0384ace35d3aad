"""Command line: ``python -m loopbridge_sglang serve [options] -- SGLANG_SERVER_OPTIONS``.

``serve`` launches SGLang's engine (its scheduler and detokenizer processes, from the
server arguments SGLang's own ``prepare_server_args`` builds) with the
``TokenizerManager`` on a dedicated owner-loop thread, and serves SGLang's own HTTP
app from a second thread through the loop-safe proxy (:func:`start_sglang_server`).
The options after ``--`` are a ``python -m sglang.launch_server`` command line; each
is honoured or refused (:mod:`loopbridge_sglang._serve_options`; ``--list-options``
prints the table). The main thread only handles signals: SIGINT or SIGTERM stops the
server first, then the engine's processes, then the owner loop (SIGQUIT, which
SGLang's watchdog sends when a subprocess dies, does the same with status 1). The
first line on stdout is ``serving on http://HOST:PORT`` (the actual port when
``--port 0``).

``--cpu-standin`` runs on a machine without SGLang's scheduler (CPU, tests, demos):
the real ``TokenizerManager`` against the stand-in scheduler process of
:mod:`loopbridge_sglang.cpu_manager`, with ``--skip-tokenizer-init --device cpu``.

``bench`` runs the latency benchmark against stock SGLang (``python -m
loopbridge_bench.sglang``) when the loopbridge-bench distribution is installed; the
adapter never imports it otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

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
        "loopbridge_bench.sglang",
        "loopbridge-bench[sglang] (in a checkout of loopbridge: pip install -e './bench[sglang]')",
    )
}
_DEFAULT_HOST = "127.0.0.1"
_DEFAULT_PORT = 30000  # stock SGLang's
_DEFAULT_GRACE = 5.0


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loopbridge_sglang serve",
        description="Serve SGLang's HTTP app from a thread, with its TokenizerManager on "
        "its own loop.",
        epilog="Options after '--' go to SGLang's server parser "
        "(python -m sglang.launch_server), starting with --model-path.",
    )
    add_listen_options(parser, _DEFAULT_HOST, _DEFAULT_PORT)
    parser.add_argument(
        "--cpu-standin",
        action="store_true",
        help="run on CPU against the stand-in scheduler (loopbridge_sglang.cpu_manager)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=_DEFAULT_GRACE,
        help="drain time on shutdown (s) before running requests are aborted "
        "(default: %(default)s)",
    )
    add_loop_options(parser, "uvloop, as SGLang's own server")
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="answer 413 to request bodies larger than this; 0: no limit, as stock SGLang "
        "(default: %(default)s, 32 MiB)",
    )
    parser.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_false",
        help="don't export loopbridge's series on /metrics nor monitor the owner loop's lag",
    )
    parser.add_argument(
        "--list-options",
        action="store_true",
        help="print every SGLang server option with how serve treats it, and exit",
    )
    return parser


@dataclasses.dataclass
class _Plan:
    server_args: Any  # SGLang's ServerArgs, from its own prepare_server_args
    host: str
    port: int
    uds: str | None = None  # SGLang's server listens on TCP only


def _plan(opts: argparse.Namespace, sglang_argv: list[str]) -> _Plan:
    """SGLang's server arguments and where to listen; :class:`UsageError` if refused."""
    from loopbridge_sglang._serve_options import given_options, refusals, server_parser

    parser = server_parser()
    given = given_options(server_parser(), sglang_argv)
    ns = parser.parse_args(sglang_argv)  # a malformed line: argparse's message, status 2
    # One source of truth for each setting: given twice is an error, not a choice.
    problems = listen_conflicts(opts, given)
    problems += refusals(parser, ns, given)
    if problems:
        raise UsageError("\n".join(problems))
    host, port = listen_on(opts, ns, given, _DEFAULT_HOST, _DEFAULT_PORT)
    from sglang.srt.server_args import prepare_server_args

    with _sglang_check():  # SGLang's own parse, config-file merge, ServerArgs.__post_init__
        server_args = prepare_server_args(sglang_argv)
    return _Plan(server_args, host, port)


@contextlib.contextmanager
def _sglang_check() -> Iterator[None]:
    """SGLang's refusal of its arguments as a :class:`UsageError` (one line)."""
    try:
        yield
    except (ValueError, TypeError, KeyError, AssertionError) as exc:
        message = str(exc.args[0] if exc.args else exc)
        raise UsageError(message.splitlines()[0] if message else type(exc).__name__) from exc


def _resolve(server_args: Any, host: str, port: int) -> None:
    """Where the server listens, then SGLang's launcher's own resolution and checks.

    Run here, before the engine starts, so a refusal is one line and status 2 (the
    launcher's own calls then find the record resolved and checked).
    """
    # The published configuration tells the truth (server_args.url(), /server_info).
    server_args.host, server_args.port = host, port
    with _sglang_check():
        server_args.resolve_once()
        server_args.check_server_args()


class _Serve(ServeCommand[_Plan]):
    owner_name = "loopbridge-sglang-owner"
    # SGLang's subprocess watchdog reports a dead scheduler or detokenizer so.
    failure_signals: ClassVar[Mapping[signal.Signals, str]] = {
        signal.SIGQUIT: "an SGLang subprocess died (SIGQUIT from its watchdog)",
    }

    def parser(self) -> argparse.ArgumentParser:
        return _serve_parser()

    def prepare(self, opts: argparse.Namespace, engine_argv: list[str]) -> list[str] | int:
        if opts.list_options:
            from loopbridge_sglang._serve_options import TABLE, server_parser

            print("\n".join(TABLE.listing(server_parser())))
            return 0
        if opts.cpu_standin:
            return ["--skip-tokenizer-init", "--device", "cpu", *engine_argv]
        return engine_argv

    def plan(self, opts: argparse.Namespace, engine_argv: list[str]) -> _Plan:
        return _plan(opts, engine_argv)

    def bound(self, opts: argparse.Namespace, plan: _Plan, sock: socket.socket) -> None:
        _resolve(plan.server_args, plan.host, int(sock.getsockname()[1]))

    async def build(self, opts: argparse.Namespace, plan: _Plan) -> Any:
        from loopbridge_sglang._launch import launch

        return await launch(plan.server_args, opts.cpu_standin)

    def start(
        self,
        opts: argparse.Namespace,
        plan: _Plan,
        engine: Any,
        owner: LoopThread,
        sock: socket.socket,
    ) -> Serving:
        from sglang.srt.utils.common import set_uvicorn_logging_configs

        from loopbridge_sglang import start_sglang_server, tokenizer_manager_proxy

        server_args = plan.server_args
        set_uvicorn_logging_configs(server_args)  # as launch_server: formats, filters
        return start_sglang_server(
            tokenizer_manager_proxy(engine.manager, loop=owner.loop),
            sock=sock,
            grace=opts.grace,
            log_level=server_args.log_level_http or server_args.log_level,
            **server_loop_options(opts),
            template_manager=engine.template_manager,
            scheduler_info=engine.scheduler_info,
            root_path=server_args.fastapi_root_path or "",
            access_log=True,  # uvicorn's default, as stock: on at log level info
            api_key=server_args.api_key,
            admin_api_key=server_args.admin_api_key,
            metrics=opts.metrics,
            max_body_bytes=opts.max_body_bytes or None,
        )

    def stop_server(self, server: Any) -> None:
        server.stop()

    def stop_engine(self, engine: Any, owner: LoopThread) -> None:
        engine.shutdown(owner)


def serve(argv: Sequence[str]) -> int:
    return _Serve().run(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run_subcommand(sys.argv[1:] if argv is None else argv, __doc__, serve, _DELEGATED)


if __name__ == "__main__":
    sys.exit(main())
