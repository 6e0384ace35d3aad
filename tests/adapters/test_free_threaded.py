"""The engines' adapters on a free-threaded Python: one line saying vLLM and SGLang
do not support it yet (loopbridge_adapters.free_threaded); the core runs there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopbridge_adapters.free_threaded import FREE_THREADED

SRC = Path(__file__).resolve().parents[2] / "src"

#: Makes this interpreter report a free-threaded build, for the adapters' check.
FORCE = (
    "import sysconfig; get = sysconfig.get_config_var; "
    "sysconfig.get_config_var = lambda name: 1 if name == 'Py_GIL_DISABLED' else get(name); "
)

CASES = [
    ("loopbridge_vllm", "vLLM does not support a free-threaded Python yet", "cp38-abi3"),
    ("loopbridge_sglang", "SGLang does not support a free-threaded Python yet", "wheels"),
]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(("package", "says", "why"), CASES)
def test_an_adapter_refuses_a_free_threaded_build_in_one_line(
    package: str, says: str, why: str
) -> None:
    proc = _run(f"{'' if FREE_THREADED else FORCE}import {package}")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("loopbridge.UnsupportedRuntime: "), proc.stderr
    assert says in last and why in last, last
    assert "loopbridge itself runs here" in last


def test_the_core_imports_where_the_adapters_refuse() -> None:
    proc = _run(
        f"{'' if FREE_THREADED else FORCE}import loopbridge, loopbridge_adapters; print('ok')"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.skipif(FREE_THREADED, reason="a free-threaded build refuses the adapters")
def test_a_standard_build_imports_both_adapters() -> None:
    proc = _run("import loopbridge_vllm, loopbridge_sglang; print('ok')")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
