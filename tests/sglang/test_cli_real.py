"""``python -m loopbridge_sglang serve``: a real process, real HTTP, real signals.

The real ``TokenizerManager`` and SGLang's own app in the served process, against the
stand-in scheduler process (``--cpu-standin``); httpx on loopback as the client (the
stand-in sends token ids and no detokenizer runs, so ``/generate`` with ``input_ids``
is the route it answers; SGLang's ``/v1/completions`` needs text).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from loopbridge_sglang import __main__ as cli


@pytest.mark.parametrize(
    ("where", "said"),
    [
        (["--max-body-bytes", "65536"], "server thread uvloop"),
        (["--on-engine-loop", "--no-metrics"], "server on the owner loop"),
    ],
)
def test_serve_answers_then_stops_in_order_without_leftovers(
    tiny_model: Path, tmp_path: Path, where: list[str], said: str
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "loopbridge_sglang",
        "serve",
        "--cpu-standin",
        "--port",
        "0",
        "--grace",
        "1",
        *where,
        "--",
        "--model-path",
        str(tiny_model),
        "--served-model-name",
        "tiny",
        "--log-level-http",
        "warning",
        "--api-key",
        "sekrit",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ),
    )
    lines: list[str] = []
    children: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:  # synchronised on the process's own output
            lines.append(line)
            match = re.match(r"serving on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url is not None, "".join(lines[-30:])
        assert lines[-1].rstrip().endswith(f", {said})"), lines[-1]
        # The stand-in scheduler is a child process while serving.
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        body = {"input_ids": [1, 5, 7], "sampling_params": {"max_new_tokens": 3}}
        # --api-key: SGLang's own middleware, as its launcher installs it; /health is open.
        with httpx.Client(base_url=url, timeout=30) as anonymous:
            assert anonymous.get("/health").status_code == 200
            assert anonymous.post("/generate", json=body).status_code == 401
            # /metrics is open, as stock's: loopbridge's series unless --no-metrics
            # (then SGLang's app answers, and without --enable-metrics it has none).
            metrics = anonymous.get("/metrics")
            if "--no-metrics" in where:
                assert metrics.status_code == 404
            else:
                assert metrics.status_code == 200 and "loopbridge_loop_lag_seconds" in metrics.text
            # A body over --max-body-bytes is refused before anything reads it.
            padded = {**body, "padding": "x" * 100_000}
            status = anonymous.post("/generate", json=padded).status_code
            assert status == (413 if "--max-body-bytes" in where else 401)
        headers = {"Authorization": "Bearer sekrit"}
        with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
            assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny"]
            out = client.post("/generate", json=body).json()
            assert out["output_ids"] == [100, 101, 102]
            assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
        lines.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = "".join(lines)
    assert proc.returncode == 0, text[-3000:]
    assert text.index("server stopped") < text.index("engine stopped")
    after = text.split("serving on", 1)[1]
    assert "Traceback" not in after and "Error" not in after, after[-3000:]
    # uvicorn at --log-level-http warning: not its start-up lines (info).
    assert "Application startup complete" not in text
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []


def test_busy_port_fails_fast_with_one_clear_line(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        argv = ["serve", "--cpu-standin", "--port", str(port), "--", "--model-path"]
        code = cli.main([*argv, str(tiny_model)])
    out, err = capsys.readouterr()
    # One line and nothing else: the engine was never started.
    assert code == 1 and out == ""
    [line] = [line for line in err.splitlines() if not line.startswith("[")]  # SGLang's log
    assert f"port {port} is already in use" in line and "--port" in line


def test_unknown_subcommand_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["frobnicate"]) == 2
    assert "unknown subcommand 'frobnicate'" in capsys.readouterr().err
