"""vLLM's plugins cost its processes only themselves.

vLLM imports every entry point of its plugin groups (``vllm.general_plugins``,
``vllm.platform_plugins``) in each of its processes, opted in or not, and importing
an entry point's module imports its package first. Each entry point loopbridge
registers (read from pyproject.toml, so a new one is covered) must therefore leave
loopbridge's core, the shared adapter package, the server and the engine proxy
unimported: ``loopbridge_vllm``'s names load on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loopbridge_adapters.free_threaded import FREE_THREADED

if FREE_THREADED:
    pytest.skip(
        "vLLM and SGLang do not support a free-threaded Python yet: their adapters refuse it",
        allow_module_level=True,
    )

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomllib is in the standard library from 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def _vllm_entry_points() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = project["entry-points"]
    return {
        f"{group}:{name}": target
        for group, points in groups.items()
        if group.startswith("vllm.")
        for name, target in points.items()
    }


ENTRY_POINTS = _vllm_entry_points()


def test_both_plugins_are_found() -> None:
    assert {key.partition(":")[0] for key in ENTRY_POINTS} == {
        "vllm.general_plugins",
        "vllm.platform_plugins",
    }


def _imported_by(module: str) -> set[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('loopbridge'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINTS))
def test_an_entry_point_imports_no_core_server_or_engine_proxy(entry_point: str) -> None:
    module = ENTRY_POINTS[entry_point].partition(":")[0]
    imported = _imported_by(module)
    assert module in imported
    heavy = {
        m
        for m in imported
        if m.partition(".")[0] in ("loopbridge", "loopbridge_adapters")
        or m in ("loopbridge_vllm.engine", "loopbridge_vllm.server")
    }
    assert heavy == set()


def test_the_package_names_load_on_first_use() -> None:
    code = (
        "import sys, loopbridge_vllm as v\n"
        "assert 'loopbridge_vllm.server' not in sys.modules\n"
        "f = v.start_openai_server\n"
        "print(f.__module__, v.EngineShutDown.__module__, v.ServerStartError.__module__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["loopbridge_vllm", "loopbridge_vllm", "loopbridge_adapters"]
