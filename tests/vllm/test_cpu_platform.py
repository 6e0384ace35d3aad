"""The CPU engines' platform: vLLM's own CPU platform with only its Triton check lifted."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from loopbridge_vllm import _cpu_platform

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release

REPO = Path(__file__).resolve().parents[2]


def test_the_plugin_is_off_unless_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_cpu_platform.ENV, raising=False)
    assert _cpu_platform.select() is None
    monkeypatch.setenv(_cpu_platform.ENV, "0")
    assert _cpu_platform.select() is None
    monkeypatch.setenv(_cpu_platform.ENV, "1")
    assert _cpu_platform.select() == _cpu_platform.PLATFORM


def test_vllm_runs_on_the_plugins_platform_here() -> None:
    """The test process (cpu_engine_env in conftest) resolved our platform."""
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform

    assert type(current_platform) is _cpu_platform.StandInCpuPlatform
    assert issubclass(type(current_platform), CpuPlatform)
    assert _cpu_platform.registration_problem() is None


def test_only_the_config_check_differs_from_vllms_cpu_platform() -> None:
    own = set(vars(_cpu_platform.StandInCpuPlatform)) - {"__module__", "__doc__", "__qualname__"}
    assert own == {"check_and_update_config"}


def test_the_check_sees_triton_only_while_it_runs() -> None:
    import vllm.triton_utils
    from vllm.platforms.cpu import CpuPlatform

    if not hasattr(vllm.triton_utils, "HAS_TRITON"):
        pytest.skip("this release has no HAS_TRITON to lift")
    seen: list[bool] = []

    def original(cls: Any, config: Any) -> None:
        seen.append(vllm.triton_utils.HAS_TRITON)

    before = vllm.triton_utils.HAS_TRITON
    with mock.patch.object(CpuPlatform, "check_and_update_config", classmethod(original)):
        _cpu_platform.StandInCpuPlatform.check_and_update_config(object())
    assert seen == [True] and vllm.triton_utils.HAS_TRITON is before


def test_an_unregistered_plugin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [])
    problem = _cpu_platform.registration_problem()
    assert problem is not None and "pip install -e ." in problem
    other = EntryPoint("loopbridge_cpu", "elsewhere:select", "vllm.platform_plugins")
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [other])
    assert _cpu_platform.registration_problem() is not None


def test_serve_without_the_plugin_says_so_in_one_line(tmp_path: Path) -> None:
    """A source tree that was never installed: one line, no traceback."""
    # A copy of the package without its metadata: vLLM cannot find the plugin.
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "src")
    code = (
        "import importlib.metadata as m, sys, runpy\n"
        "real = m.entry_points\n"
        "m.entry_points = lambda group=None, **kw: ([] if group == 'vllm.platform_plugins' "
        "else real(group=group, **kw))\n"
        "sys.argv = ['loopbridge_vllm', 'serve', 'm', '--cpu-standin']\n"
        "runpy.run_module('loopbridge_vllm', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "Traceback" in line or "error:" in line]
    assert len(lines) == 1 and lines[0].startswith("error: --cpu-standin: "), done.stderr[-3000:]
    assert "not registered" in lines[0]
