"""A ``serve`` command's lifecycle, engine aside (loopbridge_adapters.serve_lifecycle).

A recording command stands in for an engine's: its engine is a plain object built
on the owner loop, its server a thread that serves until told to stop. Both real
``serve`` commands run this lifecycle end to end in tests/vllm and tests/sglang.

Signals are sent to the main thread (where the lifecycle runs) with
``signal.pthread_kill``; its handler runs there before the lifecycle's next step, so
no test waits on time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from loopbridge import LoopThread
from loopbridge_adapters.http import ExitReason, bind
from loopbridge_adapters.serve_cli import UsageError, add_loop_options
from loopbridge_adapters.serve_lifecycle import ServeCommand, StopSignals, serve_until_stopped

BOUND_S = 30.0  # an upper bound only: every wait ends on an event well before it


@dataclasses.dataclass
class _Plan:
    host: str = "127.0.0.1"
    port: int = 0
    uds: str | None = None


class _Server:
    """Serves until stopped, or stops by itself when asked to: on a loop of its own (an
    asyncio loop a thread would run), or on the owner loop it is given."""

    def __init__(
        self, sock: socket.socket, *, by_itself: bool, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        self.sock = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.exit_reason = ExitReason.ENGINE_DIED if by_itself else None
        self._own_loop = loop is None
        self.loop = asyncio.new_event_loop() if loop is None else loop
        self._stopped = threading.Event()
        if by_itself:
            self._stopped.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def stop(self) -> None:
        self._stopped.set()
        self.sock.close()
        if self._own_loop:
            self.loop.close()


def _signal_main_thread(sig: signal.Signals) -> None:
    signal.pthread_kill(threading.main_thread().ident or 0, sig)


class _Command(ServeCommand[_Plan]):
    owner_name = "test-serve-owner"
    failure_signals: ClassVar[dict[signal.Signals, str]] = {
        signal.SIGUSR1: "the engine's watchdog says it died"
    }

    def __init__(self, plan: _Plan | None = None) -> None:
        self.steps: list[str] = []
        self.the_plan = plan or _Plan()
        self.refuse_plan = False
        self.refuse_bound = False
        self.signal_in_build: signal.Signals | None = None
        self.signal_in_start: signal.Signals | None = None
        self.server_stops_by_itself = False
        self.start_fails = False
        self.sock: socket.socket | None = None
        self.owner: LoopThread | None = None
        self.built_on: asyncio.AbstractEventLoop | None = None

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog="serve")
        parser.add_argument("--print-only", action="store_true")
        add_loop_options(parser, "asyncio")
        return parser

    def prepare(self, opts: argparse.Namespace, engine_argv: list[str]) -> list[str] | int:
        self.steps.append(f"prepare {engine_argv}")
        return 0 if opts.print_only else ["--from-prepare", *engine_argv]

    def plan(self, opts: argparse.Namespace, engine_argv: list[str]) -> _Plan:
        self.steps.append(f"plan {engine_argv}")
        if self.refuse_plan:
            raise UsageError("--a: refused\n--b: refused")
        return self.the_plan

    def bound(self, opts: argparse.Namespace, plan: _Plan, sock: socket.socket) -> None:
        self.steps.append("bound")
        self.sock = sock
        if self.refuse_bound:
            raise UsageError("the engine refuses this address")

    async def build(self, opts: argparse.Namespace, plan: _Plan) -> Any:
        self.steps.append("build")
        self.built_on = asyncio.get_running_loop()
        if self.signal_in_build is not None:
            _signal_main_thread(self.signal_in_build)
        return object()

    def start(
        self,
        opts: argparse.Namespace,
        plan: _Plan,
        engine: Any,
        owner: LoopThread,
        sock: socket.socket,
    ) -> _Server:
        self.steps.append("start")
        self.owner = owner
        assert owner.running and sock is self.sock
        if self.start_fails:
            raise RuntimeError("the app did not build")
        on_owner = owner.loop if opts.on_engine_loop else None
        server = _Server(sock, by_itself=self.server_stops_by_itself, loop=on_owner)
        if self.signal_in_start is not None:
            signal.raise_signal(self.signal_in_start)
        return server

    def stop_server(self, server: Any) -> None:
        self.steps.append("stop server")
        server.stop()

    def stop_engine(self, engine: Any, owner: LoopThread) -> None:
        assert owner.running  # the owner loop stops after the engine
        self.steps.append("stop engine")


@pytest.fixture(autouse=True)
def handlers_restored() -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    before[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    yield
    after = {sig: signal.getsignal(sig) for sig in before}
    signal.signal(signal.SIGUSR1, before[signal.SIGUSR1])
    before[signal.SIGUSR1] = signal.SIG_IGN
    assert after == before, "the lifecycle left its signal handlers installed"


def test_a_stop_signal_stops_server_then_engine_then_owner_loop(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = _Command()
    command.signal_in_start = signal.SIGTERM
    assert command.run(["--", "--engine-option", "1"]) == 0
    assert command.steps == [
        "prepare ['--engine-option', '1']",
        "plan ['--from-prepare', '--engine-option', '1']",
        "bound",
        "build",
        "start",
        "stop server",
        "stop engine",
    ]
    assert command.owner is not None and not command.owner.running
    assert command.built_on is command.owner.loop  # built on the owner loop
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("serving on http://127.0.0.1:")
    # The interval in force while it served (this fake server sets none).
    kind = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert out[0].endswith(
        f" (switch interval {sys.getswitchinterval() * 1e3:g} ms, owner loop {kind}, "
        "server thread asyncio)"
    )
    assert out[1:] == ["server stopped", "engine stopped"]


def test_no_uvloop_puts_the_owner_loop_on_asyncio(capsys: pytest.CaptureFixture[str]) -> None:
    command = _Command()
    command.signal_in_start = signal.SIGTERM
    assert command.run(["--no-uvloop"]) == 0
    assert isinstance(command.built_on, asyncio.BaseEventLoop)  # asyncio's own loop class
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(", owner loop asyncio, server thread asyncio)")


@pytest.mark.parametrize("by_itself", [False, True])
def test_on_engine_loop_serves_on_the_owner_loop_and_is_watched_there(
    by_itself: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--on-engine-loop``: the line says where it serves; a server that stops by
    itself is status 1 although the owner loop's thread (its thread) still runs."""
    command = _Command()
    command.server_stops_by_itself = by_itself
    if not by_itself:
        command.signal_in_start = signal.SIGTERM
    assert command.run(["--no-uvloop", "--on-engine-loop"]) == int(by_itself)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(", owner loop asyncio, server on the owner loop)")
    assert ("server stopped by itself (engine died)" in out) is by_itself
    assert command.steps[-2:] == ["stop server", "stop engine"]


def test_uvloop_asked_for_but_missing_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop: ImportError
    command = _Command()
    assert command.run(["--uvloop"]) == 2
    assert command.steps[-1] == "bound" and "build" not in command.steps  # no owner loop
    assert command.sock is not None and command.sock.fileno() == -1  # the socket closed
    err = capsys.readouterr().err
    assert err.startswith("error: --uvloop: uvloop is not installed: pip install uvloop, ")
    assert "or pass --no-uvloop (asyncio's loop)" in err


def test_a_server_that_stops_by_itself_is_status_1(capsys: pytest.CaptureFixture[str]) -> None:
    command = _Command()
    command.server_stops_by_itself = True
    assert command.run([]) == 1
    assert command.steps[-2:] == ["stop server", "stop engine"]
    assert "server stopped by itself (engine died)" in capsys.readouterr().out


def test_a_stop_while_the_engine_starts_starts_no_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = _Command()
    command.signal_in_build = signal.SIGINT
    assert command.run([]) == 0
    assert command.steps[-2:] == ["build", "stop engine"]
    assert command.sock is not None and command.sock.fileno() == -1  # closed, unserved
    assert capsys.readouterr().out == "engine stopped\n"


def test_a_failure_signal_is_status_1_with_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    command = _Command()
    command.signal_in_start = signal.SIGUSR1
    assert command.run([]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["the engine's watchdog says it died", "server stopped", "engine stopped"]


def test_a_failed_start_still_stops_the_engine_and_the_owner_loop() -> None:
    command = _Command()
    command.start_fails = True
    with pytest.raises(RuntimeError, match="the app did not build"):
        command.run([])
    assert command.steps[-2:] == ["start", "stop engine"]
    assert command.owner is not None and not command.owner.running
    assert command.sock is not None and command.sock.fileno() == -1


def test_prepare_may_end_the_command_before_anything_starts() -> None:
    command = _Command()
    assert command.run(["--print-only"]) == 0
    assert command.steps == ["prepare []"]


def test_a_refused_plan_is_status_2_one_line_per_problem(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = _Command()
    command.refuse_plan = True
    assert command.run([]) == 2
    assert command.steps == ["prepare []", "plan ['--from-prepare']"]
    assert capsys.readouterr().err == "error: --a: refused\nerror: --b: refused\n"


def test_a_refusal_once_bound_closes_the_socket(capsys: pytest.CaptureFixture[str]) -> None:
    command = _Command()
    command.refuse_bound = True
    assert command.run([]) == 2
    assert command.steps[-1] == "bound"
    assert command.sock is not None and command.sock.fileno() == -1
    assert capsys.readouterr().err == "error: the engine refuses this address\n"


def test_a_busy_port_is_status_1_before_the_engine_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        command = _Command(_Plan(port=port))
        assert command.run([]) == 1
    finally:
        taken.close()
    assert command.steps == ["prepare []", "plan ['--from-prepare']"]
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: port {port} is already in use (127.0.0.1:{port})")


def test_a_unix_socket_is_served_and_its_file_removed(tmp_path: Path) -> None:
    path = tmp_path / "serve.sock"
    seen: list[bool] = []

    class OnUnixSocket(_Command):
        def bound(self, opts: argparse.Namespace, plan: _Plan, sock: socket.socket) -> None:
            super().bound(opts, plan, sock)
            seen.append(sock.family == socket.AF_UNIX and path.is_socket())

    command = OnUnixSocket(_Plan(uds=str(path)))
    command.signal_in_start = signal.SIGTERM
    assert command.run([]) == 0
    assert seen == [True] and not path.exists()


def test_stop_signals_set_the_event_and_restore_the_handlers() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    with StopSignals(signal.SIGUSR1) as signals:
        assert signal.getsignal(signal.SIGUSR1) != before
        signal.raise_signal(signal.SIGUSR1)
        assert signals.stop.is_set() and signals.received is signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before


def test_serve_until_stopped_is_0_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        server = _Server(sock, by_itself=False, loop=None)
        assert serve_until_stopped(stop, server) == 0
        server.stop()
