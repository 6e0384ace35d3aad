"""What an adapter's ``serve`` command shares, whichever engine: the option table, usage.

An adapter's ``python -m loopbridge_<engine> serve`` takes the installed engine's own
server options (from the engine's own parser, never from a list kept by loopbridge)
and classifies each one with an :class:`OptionTable`:

- **honoured**: the option has the effect it has with the engine's stock server. An
  engine-configuration field is honoured through the engine (``engine_rule``), unless
  a rule says otherwise; every other option has a rule in ``honoured`` naming who acts
  on it.
- **refused**: a :class:`Refusal` says for which values, and what to do instead. The
  command then exits at once with status 2 and one line per refused option.

An option no rule covers is *unclassified*: refused when given, and each adapter's
tests fail on it (fail-closed, as the proxies' member tables are).

The command's lifecycle (signals, owner loop, build, serve, stop) is
:mod:`loopbridge_adapters.serve_lifecycle`'s.

:func:`add_listen_options`, :func:`listen_conflicts` and :func:`listen_on` are the
``--host``/``--port`` a ``serve`` command takes before ``--``: the engine's own parser
takes them after ``--`` too, and giving one in both places is an error, not a choice.
:func:`add_loop_options` is the owner loop's and the server loop's ``--uvloop`` choice,
where the server runs (a thread of its own, or ``--on-engine-loop``) and the
interpreter's switch interval while serving; :func:`server_loop_options` turns them
into the adapter servers' keyword arguments.

:func:`run_subcommand` is ``python -m loopbridge_<engine>``'s dispatch: help, ``serve``,
subcommands delegated to another module's ``main`` (a :class:`Delegate`, which may come
from another distribution), and the exit status of each.

Built on the standard library only; imports no engine and no adapter.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict

from .switch_interval import DEFAULT_SWITCH_INTERVAL_S, parse_switch_interval_ms

__all__ = [
    "Delegate",
    "OptionTable",
    "Refusal",
    "ServerLoopOptions",
    "UsageError",
    "add_listen_options",
    "add_loop_options",
    "bind_failure",
    "given_options",
    "listen_conflicts",
    "listen_on",
    "option_name",
    "report_usage_error",
    "run_subcommand",
    "server_loop_options",
    "switch_interval",
]


class UsageError(Exception):
    """A command line ``serve`` refuses: exit status 2, one line per problem."""


@dataclasses.dataclass(frozen=True)
class Refusal:
    """An option refused for the values ``when`` accepts; ``fix`` says what to do instead."""

    when: Callable[[argparse.Namespace], bool]
    fix: str


def _options(parser: argparse.ArgumentParser) -> Iterable[argparse.Action]:
    return parser._actions  # argparse's documented-by-use list of every option


@dataclasses.dataclass(frozen=True)
class OptionTable:
    """Every option of an engine's server parser, honoured or refused.

    ``engine_fields`` names the options honoured through the engine's configuration
    (``engine_rule``) unless ``honoured`` or ``refused`` has a rule for them.
    ``release`` and ``stock`` name the engine and its stock server in messages.
    """

    honoured: Mapping[str, str]
    refused: Mapping[str, Refusal]
    engine_fields: Callable[[], frozenset[str]]
    engine_rule: str
    release: str  # "this vLLM release"
    stock: str  # "vllm serve"

    def rule(self, dest: str) -> str | Refusal | None:
        """Who honours ``dest``, or its :class:`Refusal`; None if unclassified."""
        if dest in self.refused:
            return self.refused[dest]
        if dest in self.honoured:
            return self.honoured[dest]
        if dest in self.engine_fields():
            return self.engine_rule
        return None

    def unclassified(self, parser: argparse.ArgumentParser) -> list[str]:
        """``dest`` of every option of ``parser`` no rule covers, sorted."""
        engine = self.engine_fields()
        return sorted(
            {
                action.dest
                for action in _options(parser)
                if action.dest not in self.honoured
                and action.dest not in self.refused
                and action.dest not in engine
            }
        )

    def listing(self, parser: argparse.ArgumentParser) -> list[str]:
        """One line per option of ``parser``: its flag, then how it is classified."""
        lines = []
        for action in _options(parser):
            rule = self.rule(action.dest)
            if isinstance(rule, Refusal):
                text = f"refused: {rule.fix}"
            elif rule is None:
                text = "UNCLASSIFIED: refused when given"
            else:
                text = f"honoured: {rule}"
            lines.append(f"{option_name(parser, action.dest)}\t{text}")
        return lines

    def refusals(
        self, parser: argparse.ArgumentParser, ns: argparse.Namespace, given: Iterable[str]
    ) -> list[str]:
        """One line per option in ``ns`` that ``serve`` refuses.

        ``given`` holds the ``dest`` of every option the command line set: an
        unclassified option is refused only then (its default is stock's own).
        """
        lines = [
            f"{option_name(parser, dest)}: {rule.fix}"
            for dest, rule in self.refused.items()
            if hasattr(ns, dest) and rule.when(ns)
        ]
        unknown = set(self.unclassified(parser)) & set(given)
        lines += [
            f"{option_name(parser, dest)}: {self.release}'s option is not known to "
            "loopbridge, so its effect is not known to be honoured; use stock "
            f"`{self.stock}`"
            for dest in sorted(unknown)
        ]
        return lines


def option_name(parser: argparse.ArgumentParser, dest: str) -> str:
    """The option's first long flag (``--api-server-count``), or its ``dest``."""
    for action in _options(parser):
        if action.dest == dest:
            longs = [s for s in action.option_strings if s.startswith("--")]
            return (longs or action.option_strings or [dest])[0]
    return dest


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """``dest`` of every option ``argv`` sets, whatever its value.

    Parsed once more with every default suppressed, so an option given with its
    default value still counts as given.
    """
    saved = [(action, action.default, action.required) for action in _options(parser)]
    try:
        for action in _options(parser):
            action.default = argparse.SUPPRESS
            action.required = False
        given: Any = parser.parse_args(argv)
    finally:
        for action, default, required in saved:
            action.default = default
            action.required = required
    return set(vars(given))


def add_listen_options(
    parser: argparse.ArgumentParser, default_host: str, default_port: int
) -> None:
    """``--host`` and ``--port``; ``None`` means not given before ``--``."""
    parser.add_argument("--host", default=None, help=f"default: {default_host}")
    parser.add_argument(
        "--port", type=int, default=None, help=f"0 picks a free port (default: {default_port})"
    )


def listen_conflicts(opts: argparse.Namespace, given: set[str]) -> list[str]:
    """One problem per listening option given both before and after ``--``."""
    return [
        f"{flag} is given before and after '--'; give it once"
        for flag, dest in (("--host", "host"), ("--port", "port"))
        if getattr(opts, dest) is not None and dest in given
    ]


def listen_on(
    opts: argparse.Namespace,
    ns: argparse.Namespace,
    given: set[str],
    default_host: str,
    default_port: int,
) -> tuple[str, int]:
    """The host and port to bind: from after ``--``, else from before it, else the defaults."""
    host = ns.host if "host" in given else (opts.host or default_host)
    port = ns.port if "port" in given else (default_port if opts.port is None else opts.port)
    return host, port


def add_loop_options(parser: argparse.ArgumentParser, server_default: str) -> None:
    """``--uvloop``/``--no-uvloop`` (the owner loop: None, True or False, as
    :class:`loopbridge.LoopThread`'s ``use_uvloop`` takes it), ``--no-server-uvloop``
    (the HTTP server's own loop: None or False, likewise), ``--on-engine-loop`` (no such
    loop: the server on the owner loop; the two exclude each other) and
    ``--switch-interval-ms`` (the interpreter's while serving: :func:`switch_interval`)."""
    parser.add_argument(
        "--uvloop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the engine's owner loop on uvloop, or (--no-uvloop) on asyncio's (default: uvloop "
        "when installed, as the stock server's engine loop)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--no-server-uvloop",
        dest="server_uvloop",
        action="store_false",
        default=None,  # LoopThread's own default: uvloop when installed
        help=f"run the HTTP server's loop on asyncio instead of uvloop (default: {server_default})",
    )
    where.add_argument(
        "--on-engine-loop",
        action="store_true",
        help="serve HTTP on the engine's owner loop instead of a thread of its own: the stock "
        "server's topology, no request crossing a thread (this command's owner loop runs "
        "nothing else); its loop kind is --uvloop's",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=parse_switch_interval_ms,
        default=DEFAULT_SWITCH_INTERVAL_S * 1e3,
        help="the interpreter's switch interval while the server serves, in ms; off leaves the "
        f"interpreter's (default: {DEFAULT_SWITCH_INTERVAL_S * 1e3:g})",
    )


def switch_interval(opts: argparse.Namespace) -> float | None:
    """The server's ``switch_interval`` (seconds, or None) from ``--switch-interval-ms``."""
    ms: float | None = opts.switch_interval_ms
    return None if ms is None else ms / 1e3


class ServerLoopOptions(TypedDict):
    """The keyword arguments of an adapter server that say where and how it serves."""

    use_uvloop: bool | None
    on_engine_loop: bool
    switch_interval: float | None


def server_loop_options(opts: argparse.Namespace) -> ServerLoopOptions:
    """What :func:`add_loop_options` parsed, as an adapter server's ``use_uvloop``,
    ``on_engine_loop`` and ``switch_interval`` (a server on the owner loop takes no
    loop choice of its own: ``use_uvloop`` None)."""
    return ServerLoopOptions(
        use_uvloop=None if opts.on_engine_loop else opts.server_uvloop,
        on_engine_loop=opts.on_engine_loop,
        switch_interval=switch_interval(opts),
    )


def report_usage_error(exc: UsageError) -> int:
    """Print each problem as one ``error:`` line on stderr; the exit status (2)."""
    for line in str(exc).splitlines():
        print(f"error: {line}", file=sys.stderr, flush=True)
    return 2


def bind_failure(host: str, port: int, uds: str | None, exc: OSError) -> str:
    """The one line to print when the listening socket cannot be bound."""
    if uds:
        return f"error: cannot listen on the Unix socket {uds}: {exc.strerror or exc}; check --uds"
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"error: port {port} is already in use ({where}): stop the process that "
            "listens on it, or choose another port with --port (0 picks a free one)"
        )
    return f"error: cannot listen on {where}: {exc.strerror or exc}; check --host and --port"


class Delegate(NamedTuple):
    """A subcommand whose ``main(argv)`` lives in another module, maybe not installed."""

    module: str  # the module whose main runs the subcommand
    install: str  # what to install when the module is missing (named in the error)


def run_subcommand(
    argv: Sequence[str],
    doc: str | None,
    serve: Callable[[list[str]], int],
    delegated: Mapping[str, Delegate],
) -> int:
    """Run ``python -m loopbridge_<engine> SUBCOMMAND ...``; return the exit status.

    No arguments, ``-h`` or ``--help`` print ``doc`` and the subcommands (status 2 when
    nothing was given, 0 when help was asked for). ``serve`` gets the rest of the
    command line; a ``delegated`` subcommand names a module whose ``main(argv)`` runs
    it (status 0 unless that returns an int), and one whose module (or a package above
    it) is not installed is reported with what to install, rather than as a traceback.
    """
    args = list(argv)
    subcommands = ("serve", *delegated)
    if not args or args[0] in ("-h", "--help"):
        print(doc)
        print("subcommands: " + ", ".join(subcommands))
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        return serve(rest)
    target = delegated.get(command)
    if target is None:
        known = ", ".join(subcommands)
        print(f"unknown subcommand {command!r} (known: {known})", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(target.module)
    except ModuleNotFoundError as exc:
        # A module the target itself imports being missing is the target's own error.
        if exc.name is None or not f"{target.module}.".startswith(f"{exc.name}."):
            raise
        print(
            f"subcommand {command!r} needs {target.module}, which is not installed: "
            f"install {target.install}",
            file=sys.stderr,
        )
        return 2
    result = module.main(rest)
    return result if isinstance(result, int) else 0
