"""``python -m loopbridge_vllm serve``: a real process, real HTTP, real signals, a busy port."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from vllm_engines import REPO, serve_env


def _env() -> dict[str, str]:
    return serve_env()


@pytest.mark.every_release
@pytest.mark.parametrize(
    ("where", "said"),
    [([], "server thread uvloop"), (["--on-engine-loop"], "server on the owner loop")],
)
def test_serve_answers_and_stops_server_before_engine(
    tiny_model: Path, where: list[str], said: str
) -> None:
    env = _env()
    cmd = [
        sys.executable,
        "-m",
        "loopbridge_vllm",
        "serve",
        str(tiny_model),
        "--port",
        "0",
        "--cpu-standin",
        "--grace",
        "1",
        *where,
        "--",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "256",
    ]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    )
    lines: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            match = re.match(r"serving on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url is not None, "".join(lines[-30:])
        # The server's switch interval while it serves and where it serves, on the same line.
        ending = f" (switch interval 1 ms, owner loop uvloop, {said})"
        assert lines[-1].rstrip().endswith(ending), lines[-1]
        with httpx.Client(base_url=url, timeout=30) as client:
            assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny"]
            body = {"model": "tiny", "prompt": "Hello", "max_tokens": 3, "ignore_eos": True}
            assert (
                client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 3
            )
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        lines.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = "".join(lines)
    assert proc.returncode == 0, text[-3000:]
    assert text.index("server stopped") < text.index("engine stopped")
    assert "Traceback" not in text.split("serving on", 1)[1]


def test_unknown_subcommand_is_a_clear_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loopbridge_vllm", "frobnicate"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unknown subcommand" in done.stderr


def test_busy_port_fails_fast_with_one_clear_line(tiny_model: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        argv = ["serve", str(tiny_model), "--port", str(port), "--cpu-standin"]
        done = subprocess.run(
            [sys.executable, "-m", "loopbridge_vllm", *argv],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
    output = (done.stdout + done.stderr).strip().splitlines()
    # One line and nothing else: no traceback, and no engine log, since the
    # engine was never built.
    assert done.returncode == 1, output
    assert len(output) == 1, output
    line = output[0]
    assert f"port {port} is already in use" in line and "--port" in line


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ([], ["--api-server-count", "2"], "error: --api-server-count: "),
        # The option given is the one named, not --api-server-count.
        ([], ["--data-parallel-size", "2"], "error: --data-parallel-size: "),
        # One line, not vLLM's whole usage labelled __main__.py.
        ([], ["--no-such-option"], "error: after '--': unrecognized arguments: --no-such-option"),
        (["--port", "0"], ["--port", "0"], "error: --port is given before and after '--'"),
        ([], ["--enable-auto-tool-choice"], "error: --enable-auto-tool-choice requires"),
    ],
)
@pytest.mark.every_release
def test_refused_command_line_exits_2_with_one_line(
    tiny_model: Path, before: list[str], after: list[str], expected: str
) -> None:
    argv = ["serve", str(tiny_model), "--cpu-standin", *before, "--", *after]
    done = subprocess.run(
        [sys.executable, "-m", "loopbridge_vllm", *argv],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    # One line on stderr and nothing else: the engine was never built.
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if not _library_noise(line)]
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    assert [line for line in done.stdout.splitlines() if not _library_noise(line)] == []


#: A line of vLLM's own logger: "INFO 12-03 06:03:39 [__init__.py:52] ...".
_VLLM_LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] ")


def _library_noise(line: str) -> bool:
    # torch prints deprecation notes on import, before our code runs; vLLM 0.29
    # and 0.24 log at INFO when they are imported and resolve their platform
    # (stock `vllm serve` prints the same lines).
    return (line.startswith("W") and "torch" in line) or bool(_VLLM_LOG_LINE.match(line))


def test_unix_socket_and_log_level_after_dashes(tiny_model: Path, tmp_path: Path) -> None:
    from vllm_engines import ServeProcess

    path = tmp_path / "serve.sock"
    server = ServeProcess(
        [
            sys.executable,
            "-m",
            "loopbridge_vllm",
            "serve",
            str(tiny_model),
            "--cpu-standin",
            "--grace",
            "1",
            "--",
            "--uds",
            str(path),
            "--served-model-name",
            "tiny",
            "--uvicorn-log-level",
            "warning",
        ]
    )
    try:
        assert server.wait_for(r"serving on (\S+)", 300).group(1) == f"unix:{path}"
        transport = httpx.HTTPTransport(uds=str(path))
        with httpx.Client(transport=transport, base_url="http://serve", timeout=30) as client:
            assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    finally:
        server.stop()
    assert server.proc.returncode == 0
    out = "".join(server.lines)
    # uvicorn at warning: neither its start-up lines nor the access log (both info).
    assert "Application startup complete" not in out and "GET /v1/models" not in out
    assert not path.exists()  # the socket file is removed on exit
