"""The ``stock`` reference: vLLM's own ``vllm serve``, in its own process.

It is started the way a user starts it (vLLM's command-line entry point, which
runs the server on uvloop in the process's main thread, with the EngineCore in
a child process), over the same engine configuration as the threaded stack:
its flags are derived from the very ``AsyncEngineArgs`` the threaded stack's
engine is built from (same model, served name, batch limit, context length,
dtype and, on CPU, the same stand-in executor through
``--distributed-executor-backend``; the child imports it through
``PYTHONPATH``, which ``cpu_engine_env`` sets).

It runs in a process group of its own, under the guardian of :mod:`._group`:
stopping it also reaches the EngineCore it spawned, and the whole group dies
with the benchmark, even when the benchmark is killed: nothing is left running
after :meth:`StockServer.stop` or after the benchmark's process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from loopbridge_bench.common.threads import TICK_S, stat_fields

from ._group import group_members, parent_of, spawn_group

__all__ = ["StockServer", "StockStartError", "stock_argv"]


_KV_LINE = re.compile(rb"KV cache size: ([\d,]+) tokens")


class StockStartError(RuntimeError):
    """``vllm serve`` exited or did not answer ``/health`` in time."""


def _flag(key: str, value: Any) -> list[str]:
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [name, *value]  # nargs="+" options such as --served-model-name
    if isinstance(value, (dict, list)):
        return [name, json.dumps(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A vLLM config object (e.g. --weight-transfer-config): its fields as JSON.
        return [name, json.dumps(dataclasses.asdict(value))]
    return [name, str(value)]


def engine_settings(args: Any) -> dict[str, Any]:
    """The fields of ``AsyncEngineArgs`` ``args`` that differ from vLLM's defaults."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    base = AsyncEngineArgs(model=args.model)
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(args)
        if f.name != "model" and getattr(args, f.name) != getattr(base, f.name)
    }


def stock_argv(engine_args: Any, host: str, port: int) -> list[str]:
    """``vllm serve`` arguments for the engine the threaded stack builds from ``engine_args``.

    Derived from the same ``AsyncEngineArgs`` object, so the two engines cannot
    drift apart: every setting that differs from vLLM's default becomes a flag.
    """
    argv = [str(engine_args.model), "--host", host, "--port", str(port)]
    # The threaded server does not log each request either (server.serve_args).
    argv.append("--disable-uvicorn-access-log")
    for key, value in engine_settings(engine_args).items():
        argv += _flag(key, value)
    return argv


def check_stock_argv(argv: list[str], engine_args: Any) -> Any:
    """Parse ``argv`` with vLLM's own ``serve`` parser and check it means ``engine_args``.

    Raises ``ValueError`` on an option ``vllm serve`` does not know, or when the
    engine it would build differs from the threaded stack's in any setting.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    from loopbridge_vllm.server import _make_parser

    parser = _make_parser()
    args, unknown = parser.parse_known_args(["--model", *argv])
    if unknown:
        raise ValueError(f"vllm serve does not accept {unknown}")
    theirs = AsyncEngineArgs.from_cli_args(args)
    # What the flags change, against the same command line without them (the
    # command line's defaults differ from the dataclass's in places).
    bare = AsyncEngineArgs.from_cli_args(parser.parse_args(["--model", argv[0]]))
    ours = engine_settings(engine_args)
    changed = {
        f.name
        for f in dataclasses.fields(theirs)
        if getattr(theirs, f.name) != getattr(bare, f.name)
    }
    wrong = {k for k in ours if getattr(theirs, k) != ours[k]} | (changed - set(ours))
    if wrong:
        diff = {k: (ours.get(k), getattr(theirs, k)) for k in sorted(wrong)}
        raise ValueError(f"vllm serve would build another engine (ours, stock): {diff}")
    return args


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class StockServer:
    """One ``vllm serve`` process; :meth:`start` returns at once, :meth:`wait_ready` blocks."""

    def __init__(self, engine_args: Any, log_path: Path) -> None:
        self.host = "127.0.0.1"
        self.port = _free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        self.argv = stock_argv(engine_args, self.host, self.port)
        self.command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *self.argv]
        self.log_path = log_path
        self.version: str | None = None  # what the server's own /version reports
        self._proc: subprocess.Popen[bytes] | None = None  # the group's guardian
        self._server_pid: int | None = None
        self._log: IO[bytes] | None = None

    def start(self, env: dict[str, str]) -> StockServer:
        """Start it (from the thread that will stop it: see :mod:`._group`)."""
        self._log = self.log_path.open("wb")
        self._proc = spawn_group(self.command, env=env, stdout=self._log)
        return self

    @property
    def pgid(self) -> int | None:
        """Its process group: the guardian, the server and the server's children."""
        return None if self._proc is None else self._proc.pid

    def server_pid(self) -> int | None:
        """The ``vllm serve`` process itself (the guardian's child)."""
        if self._server_pid is None and self._proc is not None:
            guardian = self._proc.pid
            self._server_pid = next(
                (p for p in group_members(guardian) if parent_of(p) == guardian), None
            )
        return self._server_pid

    def wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise StockStartError(f"vllm serve exited during start-up:\n{self._tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    self.version = str(
                        httpx.get(self.url + "/version", timeout=5).json()["version"]
                    )
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.5)  # polling a process we do not control, with a deadline
        raise StockStartError(
            f"vllm serve did not answer /health in {timeout:.0f} s:\n{self._tail()}"
        )

    def kv_cache(self) -> dict[str, Any]:
        """Its KV-cache size in tokens, from its log (it runs at INFO for this line)."""
        found = _KV_LINE.findall(self.log_path.read_bytes()) if self.log_path.exists() else []
        tokens = int(found[-1].replace(b",", b"")) if found else None
        return {"tokens": tokens, "source": "log" if found else "not in its log"}

    def cpu_seconds(self) -> float:
        """CPU seconds the server process (not its EngineCore) has used so far (Linux)."""
        pid = self.server_pid()
        if pid is None:
            return 0.0
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat_fields(stat)
        return (int(fields[11]) + int(fields[12])) * TICK_S

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (vLLM's own clean shutdown, through the guardian), then SIGKILL the whole
        group if needed."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the EngineCore, if it outlived the server
            except ProcessLookupError:
                pass
            proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
