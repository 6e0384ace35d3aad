"""The pytest plugin, exercised in real pytest subprocesses: command-line
option, ini option, marker, and exemption."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import loopbridge

SRC = str(Path(loopbridge.__file__).resolve().parent.parent)

SUITE = '''
import asyncio, threading
import pytest


def misuse_swallowed():
    """Event.set from a foreign thread whose exception nobody sees."""
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, name="owner")
    t.start()

    async def make():
        ev = asyncio.Event()
        ev.clear()
        return ev

    ev = asyncio.run_coroutine_threadsafe(make(), loop).result(5)

    def intruder():
        try:
            ev.set()
        except Exception:
            pass          # swallowed: only the plugin can still fail the test
    w = threading.Thread(target=intruder)
    w.start()
    w.join()
    loop.call_soon_threadsafe(loop.stop)
    t.join()
    loop.close()


def test_misuse():
    misuse_swallowed()


def test_clean():
    async def main():
        q = asyncio.Queue()
        await q.put(1)
        return await q.get()
    assert asyncio.run(main()) == 1


@pytest.mark.loopbridge_sanitize("off")
def test_exempt():
    misuse_swallowed()


@pytest.mark.loopbridge_sanitize
def test_marked():
    misuse_swallowed()


@pytest.mark.loopbridge_sanitize("warn")
def test_marked_warn():
    misuse_swallowed()
'''


def _plugin_args() -> list[str]:
    eps = importlib.metadata.entry_points(group="pytest11")
    if any(ep.value == "loopbridge.pytest_plugin" for ep in eps):
        return []
    return ["-p", "loopbridge.pytest_plugin"]


def _run(tmp_path: Path, *args: str, ini: str = "") -> tuple[int, dict[str, str], str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + ini)
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC
    env.pop("LOOPBRIDGE_SANITIZE", None)
    xml = tmp_path / "out.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            *_plugin_args(),
            f"--junit-xml={xml}",
            "-q",
            *args,
            "test_suite.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        # A hang guard, under the core lanes' 300 s per test: on a starved
        # 2-core machine this small run has taken over 120 s.
        timeout=280,
    )
    outcomes: dict[str, str] = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name", "")
            kinds = {child.tag for child in case}
            outcomes[name] = (
                "error" if "error" in kinds else "failed" if "failure" in kinds else "passed"
            )
    return proc.returncode, outcomes, proc.stdout + proc.stderr


def test_command_line_option(tmp_path: Path) -> None:
    code, outcomes, out = _run(tmp_path, "--loopbridge-sanitize=raise")
    assert code == 1, out
    assert outcomes == {
        "test_misuse": "error",
        "test_clean": "passed",
        "test_exempt": "passed",
        "test_marked": "error",
        "test_marked_warn": "passed",
    }, out
    assert "loopbridge sanitizer found 1 misuse(s)" in out
    assert "asyncio.Event.set() called from the wrong thread" in out
    assert "SanitizerWarning" in out  # the warn-marked test still warned


def test_ini_option(tmp_path: Path) -> None:
    code, outcomes, out = _run(tmp_path, ini="loopbridge_sanitize = raise\n")
    assert outcomes["test_misuse"] == "error" and outcomes["test_clean"] == "passed", out
    assert code == 1, out  # a misuse fails the run


def test_marker_only(tmp_path: Path) -> None:
    code, outcomes, out = _run(tmp_path)
    assert outcomes == {
        "test_misuse": "passed",
        "test_clean": "passed",
        "test_exempt": "passed",
        "test_marked": "error",
        "test_marked_warn": "passed",
    }, out
    assert code == 1, out


def test_bad_value_is_a_usage_error(tmp_path: Path) -> None:
    code, _, out = _run(tmp_path, ini="loopbridge_sanitize = sometimes\n")
    assert code == 4, out
    assert "loopbridge_sanitize" in out and "sometimes" in out
