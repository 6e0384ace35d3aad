"""Private internals are checked, and a missing one fails loudly, not silently."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopbridge import _compat
from loopbridge._compat import UnsupportedRuntime
from loopbridge_adapters.free_threaded import FREE_THREADED

SRC = Path(__file__).resolve().parents[2] / "src"


def test_this_runtime_passes_every_check() -> None:
    _compat.check_counter_repr()
    loop = asyncio.new_event_loop()
    try:
        _compat.check_loop(loop)
        assert _compat.ready_queue(loop) is loop._ready  # type: ignore[attr-defined]
    finally:
        loop.close()


def test_a_counter_without_the_expected_repr_is_refused() -> None:
    class Opaque:
        def __init__(self) -> None:
            self.n = 0

        def __next__(self) -> int:
            self.n += 1
            return self.n

        def __repr__(self) -> str:
            return "<counter>"

    with pytest.raises(UnsupportedRuntime, match=r"repr\(itertools.count\)"):
        _compat.check_counter_repr(Opaque)


def test_a_stock_loop_without_its_thread_id_is_refused() -> None:
    loop = asyncio.new_event_loop()
    try:
        del loop._thread_id  # type: ignore[attr-defined]
        with pytest.raises(UnsupportedRuntime, match="_thread_id"):
            _compat.check_loop(loop)
        with pytest.raises(UnsupportedRuntime, match="_thread_id"):
            import loopbridge._ports as ports

            ports.port_for_loop(loop)
    finally:
        loop._thread_id = None  # type: ignore[attr-defined]
        loop.close()


def test_a_missing_internal_fails_at_import() -> None:
    code = "import asyncio; del asyncio._get_running_loop; import loopbridge"
    proc = _import_in_a_new_process(code)
    assert proc.returncode != 0
    assert "UnsupportedRuntime" in proc.stderr
    assert "asyncio._get_running_loop()" in proc.stderr


def test_gil_enabled_says_what_the_interpreter_says() -> None:
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    assert _compat.gil_enabled() is (True if is_gil_enabled is None else is_gil_enabled())


def test_a_free_threaded_interpreter_without_the_gil_is_accepted_at_import() -> None:
    """Every cross-thread handshake is safe without the GIL (docs/concepts.md), so a
    build running with it disabled imports loopbridge.  Forced where the build is
    not free-threaded: ``sys._is_gil_enabled()`` (3.13+) answers False, as it does
    on a build run with the GIL disabled; on 3.13t with PYTHON_GIL=0 it is real."""
    code = (
        "import sys; sys._is_gil_enabled = lambda: False; import loopbridge; "
        "from loopbridge import _compat; print(_compat.gil_enabled())"
    )
    proc = _import_in_a_new_process(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_free_threaded_interpreter_with_the_gil_on_is_accepted() -> None:
    code = "import sys; sys._is_gil_enabled = lambda: True; import loopbridge; print('ok')"
    proc = _import_in_a_new_process(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.skipif(not FREE_THREADED, reason="needs a free-threaded build (3.13t)")
def test_on_a_free_threaded_build_importing_loopbridge_keeps_the_gil_off() -> None:
    """An extension module that does not declare itself safe without the GIL turns
    it back on at import (with a warning): none that loopbridge imports does."""
    code = (
        "import loopbridge, loopbridge.metrics, loopbridge.sanitizer, sys; "
        "print(sys._is_gil_enabled())"
    )
    proc = _import_in_a_new_process(code, PYTHON_GIL="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", proc.stderr


def _import_in_a_new_process(code: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), **env_vars}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
