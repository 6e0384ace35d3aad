"""``python -m loopbridge_vllm serve`` on a busy port: one clear line, before any engine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from vllm_engines import REPO


def test_busy_port_fails_fast_with_one_clear_line(tiny_model: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p
    )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "loopbridge_vllm",
                "serve",
                str(tiny_model),
                "--port",
                str(port),
                "--cpu-standin",
            ],
            env=env,
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
