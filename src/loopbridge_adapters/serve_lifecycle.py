"""An adapter's ``serve`` command from its command line to its exit status, whichever engine.

:meth:`ServeCommand.run` is the lifecycle both ``python -m loopbridge_<engine> serve``
commands run; an adapter subclasses :class:`ServeCommand` and writes only its engine's
steps (the options, the plan, building the engine, starting its server, stopping
both). In order:

1. split the command line at the first ``--``: loopbridge's options before it (the
   adapter's :meth:`~ServeCommand.parser`), the engine's own after it;
2. :meth:`~ServeCommand.prepare` the engine's command line (or end here with a
   status: an option that only prints, a set-up the machine refuses);
3. :meth:`~ServeCommand.plan`: what to build and where to listen, or a
   :class:`~loopbridge_adapters.serve_cli.UsageError` (status 2, one line per
   problem);
4. bind the listening socket (a busy port is known in milliseconds, not after the
   engine's start-up; status 1 and one line), then :meth:`~ServeCommand.bound`;
5. install the stop signals (:class:`StopSignals`: the main thread's business;
   neither the owner loop nor the server thread installs handlers) and start the
   owner loop (:class:`loopbridge.LoopThread`; uvloop when installed, as the stock
   server's engine loop, unless ``--no-uvloop``);
6. :meth:`~ServeCommand.build` the engine on the owner loop, :meth:`~ServeCommand.start`
   its server, print ``serving on URL`` (the first line on stdout) and wait for a stop
   signal (status 0) or for the server to stop by itself (status 1);
7. stop the server, then the engine, then the owner loop, then restore the signal
   handlers and remove a Unix socket's file.

Invariants: the stop runs in that order on every path, an exception's included; a
step that was never reached is not undone (no server: the socket is closed instead);
a stop signal that arrives while the engine starts stops it before any server starts
(status 0); a signal in :attr:`ServeCommand.failure_signals` ends with status 1 and
its line.

Built on the core's public API and the standard library; imports no engine and no
adapter.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from loopbridge import LoopThread

from .http import bind, bind_unix, loop_kind
from .serve_cli import UsageError, bind_failure, report_usage_error

__all__ = ["Plan", "ServeCommand", "Serving", "StopSignals", "serve_until_stopped"]


class Plan(Protocol):
    """What a ``serve`` command's plan says about where to listen."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def uds(self) -> str | None:
        """A Unix socket's path to listen on instead of ``host:port``; else None."""


class Serving(Protocol):
    """A started server, as the lifecycle waits for it."""

    @property
    def url(self) -> str: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop it serves on: its own thread's, or the engine's owner loop."""

    @property
    def exit_reason(self) -> Any: ...

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """True once serving has ended, by a stop or by itself (within ``timeout``)."""


class StopSignals:
    """Once installed (or entered): the given signals (default SIGINT, SIGTERM) set
    :attr:`stop`.

    Signals are the main thread's business: neither an owner loop nor a server thread
    installs handlers. The previous handlers come back on exit.
    """

    def __init__(self, *signals: signal.Signals) -> None:
        self.stop = threading.Event()
        self.received: signal.Signals | None = None
        self._signals = signals or (signal.SIGINT, signal.SIGTERM)
        self._previous: dict[signal.Signals, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)
        self.stop.set()

    def install(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in self._signals}
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def _owner_loop(name: str, opts: argparse.Namespace) -> LoopThread:
    """The owner loop's thread (not started), its kind from ``--uvloop``/``--no-uvloop``;
    an explicit ``--uvloop`` without uvloop installed is a usage error."""
    try:
        return LoopThread(name, use_uvloop=opts.uvloop)
    except ImportError:
        raise UsageError(
            "--uvloop: uvloop is not installed: pip install uvloop, or leave --uvloop out "
            "(uvloop when installed) or pass --no-uvloop (asyncio's loop)"
        ) from None


def serve_until_stopped(stop: threading.Event, server: Serving, poll: float = 0.2) -> int:
    """Wait until ``stop`` is set (status 0) or the server stops by itself (status 1)."""
    while not stop.wait(poll):
        if server.wait_stopped(0):  # its thread's end, or (on the owner loop) serving's
            reason = server.exit_reason.value if server.exit_reason else "unknown"
            print(f"server stopped by itself ({reason})", flush=True)
            return 1
    return 0


def _topology(owner: LoopThread, server: Serving) -> str:
    """The serving line's settings: the switch interval (the server's, while it serves),
    the owner loop's kind, and where the server runs."""
    interval = sys.getswitchinterval() * 1e3
    if server.loop is owner.loop:
        where = "server on the owner loop"
    else:
        where = f"server thread {loop_kind(server.loop) if server.loop else '?'}"
    return f"switch interval {interval:g} ms, owner loop {loop_kind(owner.loop)}, {where}"


_P = TypeVar("_P", bound=Plan)


class ServeCommand(abc.ABC, Generic[_P]):
    """One engine's ``serve`` command: its steps, which :meth:`run` takes in order.

    ``opts`` is what :meth:`parser` parsed (it has ``uvloop``, from
    :func:`~loopbridge_adapters.serve_cli.add_loop_options`); ``plan`` what
    :meth:`plan` returned.
    """

    #: The owner loop thread's name.
    owner_name: ClassVar[str]
    #: Signals that stop the command as a failure (status 1), with the line to print.
    failure_signals: ClassVar[Mapping[signal.Signals, str]] = {}

    @abc.abstractmethod
    def parser(self) -> argparse.ArgumentParser:
        """The options before ``--``."""

    def prepare(self, opts: argparse.Namespace, engine_argv: list[str]) -> list[str] | int:
        """The engine's command line as :meth:`plan` gets it, or the exit status that
        ends the command here (default: the command line as given)."""
        return engine_argv

    @abc.abstractmethod
    def plan(self, opts: argparse.Namespace, engine_argv: list[str]) -> _P:
        """What to build and where to listen; raises ``UsageError`` if refused."""

    def bound(self, opts: argparse.Namespace, plan: _P, sock: socket.socket) -> None:
        """Once the socket is bound, before the owner loop starts; may raise
        ``UsageError`` (the socket is closed then)."""
        return None

    @abc.abstractmethod
    async def build(self, opts: argparse.Namespace, plan: _P) -> Any:
        """On the owner loop: the engine (its handler then starts on that loop)."""

    @abc.abstractmethod
    def start(
        self,
        opts: argparse.Namespace,
        plan: _P,
        engine: Any,
        owner: LoopThread,
        sock: socket.socket,
    ) -> Serving:
        """The engine's server, started on ``sock``, serving."""

    @abc.abstractmethod
    def stop_server(self, server: Any) -> None:
        """Stop the server (the engine is stopped next, by :meth:`stop_engine`)."""

    @abc.abstractmethod
    def stop_engine(self, engine: Any, owner: LoopThread) -> None:
        """Stop the engine (its owner loop is stopped next)."""

    def run(self, argv: Sequence[str]) -> int:
        """The whole command (see the module docstring); its exit status."""
        argv = list(argv)
        engine_argv: list[str] = []
        if "--" in argv:
            cut = argv.index("--")
            argv, engine_argv = argv[:cut], argv[cut + 1 :]
        opts = self.parser().parse_args(argv)
        prepared = self.prepare(opts, engine_argv)
        if isinstance(prepared, int):
            return prepared
        try:
            plan = self.plan(opts, prepared)
        except UsageError as exc:
            return report_usage_error(exc)
        try:
            sock = bind_unix(plan.uds) if plan.uds else bind(plan.host, plan.port)
        except OSError as exc:
            print(bind_failure(plan.host, plan.port, plan.uds, exc), file=sys.stderr, flush=True)
            return 1
        try:
            return self._run_bound(opts, plan, sock)
        finally:
            if plan.uds:
                with contextlib.suppress(OSError):
                    os.unlink(plan.uds)

    def _run_bound(self, opts: argparse.Namespace, plan: _P, sock: socket.socket) -> int:
        try:
            self.bound(opts, plan, sock)
            owner = _owner_loop(self.owner_name, opts)
        except UsageError as exc:
            sock.close()
            return report_usage_error(exc)
        signals = StopSignals(signal.SIGINT, signal.SIGTERM, *self.failure_signals).install()
        owner.start()
        try:
            return self._serve(opts, plan, sock, owner, signals)
        finally:
            owner.stop()
            signals.restore()

    def _serve(
        self,
        opts: argparse.Namespace,
        plan: _P,
        sock: socket.socket,
        owner: LoopThread,
        signals: StopSignals,
    ) -> int:
        engine: Any = None
        server: Any = None
        try:
            engine = owner.run(self.build, opts, plan)
            code = 0  # asked to stop while the engine started: no server
            if not signals.stop.is_set():
                server = self.start(opts, plan, engine, owner, sock)
                print(f"serving on {server.url} ({_topology(owner, server)})", flush=True)
                code = serve_until_stopped(signals.stop, server)
            received = signals.received
            if received is not None and received in self.failure_signals:
                print(self.failure_signals[received], flush=True)
                code = 1
            return code
        finally:
            if server is not None:
                self.stop_server(server)
                print("server stopped", flush=True)
            else:
                sock.close()
            if engine is not None:
                self.stop_engine(engine, owner)
                print("engine stopped", flush=True)
            # Drop the engine while the interpreter is intact (an engine's __del__ may
            # shut it down again, which fails during interpreter teardown).
            engine = server = None
            gc.collect()
