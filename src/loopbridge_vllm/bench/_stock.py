"""The ``stock`` reference: vLLM's own ``vllm serve``, in its own process.

It is started the way a user starts it (vLLM's command-line entry point, which
runs the server on uvloop in the process's main thread, with the EngineCore in
a child process), over the same engine configuration as the threaded stack:
the same model, the same served name, batch limit and context length, and on
CPU the same stand-in executor (``--distributed-executor-backend``; the child
imports it through ``PYTHONPATH``, which :func:`cpu_engine_env` sets).  Only
``--port`` and ``--host`` differ.

The process gets its own session, so that stopping it also reaches the
EngineCore it spawned: nothing is left running after :meth:`StockServer.stop`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from ._stack import SERVED_NAME, EngineSpec

__all__ = ["StockServer", "StockStartError", "stock_argv"]


class StockStartError(RuntimeError):
    """``vllm serve`` exited or did not answer ``/health`` in time."""


def _flag(key: str, value: Any) -> list[str]:
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [name, json.dumps(value)]
    return [name, str(value)]


def stock_argv(spec: EngineSpec, model_dir: Path, host: str, port: int) -> list[str]:
    """``vllm serve`` arguments equivalent to the threaded stack's engine."""
    from loopbridge_vllm.cpu_engine import STANDIN_BACKEND

    argv = [str(model_dir), "--host", host, "--port", str(port)]
    argv += ["--served-model-name", SERVED_NAME, "--max-num-seqs", str(spec.max_num_seqs)]
    # Both servers skip the same per-request work.
    argv += ["--disable-log-stats", "--disable-uvicorn-access-log"]
    if spec.max_model_len:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.model is None:  # the stand-in engine's fixed settings (cpu_engine's defaults)
        argv += ["--dtype", "float32", "--enforce-eager"]
        argv += ["--distributed-executor-backend", STANDIN_BACKEND]
    for key, value in spec.engine_args:
        argv += _flag(key, value)
    return argv


def check_stock_argv(argv: list[str]) -> Any:
    """Parse ``argv`` with vLLM's own ``serve`` parser (raises on an unknown option)."""
    from loopbridge_vllm.server import _make_parser

    parser = _make_parser()
    args, unknown = parser.parse_known_args(["--model", *argv])
    if unknown:
        raise ValueError(f"vllm serve does not accept {unknown}")
    return args


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class StockServer:
    """One ``vllm serve`` process; :meth:`start` returns at once, :meth:`wait_ready` blocks."""

    def __init__(self, spec: EngineSpec, model_dir: Path, log_path: Path) -> None:
        self.host = "127.0.0.1"
        self.port = _free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        self.argv = stock_argv(spec, model_dir, self.host, self.port)
        self.command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *self.argv]
        self.log_path = log_path
        self.version: str | None = None  # what the server's own /version reports
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, env: dict[str, str]) -> StockServer:
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group: the server and its EngineCore
        )
        return self

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

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (vLLM's own clean shutdown), then SIGKILL the whole group if needed."""
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
