"""Turning the sanitizer on and off: context manager, install(), the
environment variable (in real subprocesses, including a spawned child that
never imports loopbridge), and that "off" means nothing is patched."""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.futures
import asyncio.mixins
import asyncio.selector_events
import asyncio.tasks
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from sanitizer_support import LoopInThread, in_thread, skip_if_installed_for_session

import loopbridge
from loopbridge import sanitizer
from loopbridge.sanitizer import (
    SanitizerError,
    install,
    install_from_env,
    sanitize,
    uninstall,
)

SRC = str(Path(loopbridge.__file__).resolve().parent.parent)


def _snapshot() -> dict[str, Any]:
    """Every attribute the sanitizer may replace, by identity."""
    owners: list[tuple[str, Any]] = [
        ("Event", asyncio.Event),
        ("Lock", asyncio.Lock),
        ("Semaphore", asyncio.Semaphore),
        ("Condition", asyncio.Condition),
        ("Queue", asyncio.Queue),
        ("mixin", asyncio.mixins._LoopBoundMixin),
        ("BaseEventLoop", asyncio.base_events.BaseEventLoop),
        ("BaseSelectorEventLoop", asyncio.selector_events.BaseSelectorEventLoop),
    ]
    try:
        import uvloop

        owners.append(("uvloop.Loop", uvloop.Loop))
    except ImportError:  # pragma: no cover
        pass
    snap: dict[str, Any] = {}
    for label, cls in owners:
        for name, value in vars(cls).items():
            snap[f"{label}.{name}"] = value
    for mod in (asyncio, asyncio.futures, asyncio.tasks):
        snap[f"{mod.__name__}.Future"] = vars(mod).get("Future")
        snap[f"{mod.__name__}.Task"] = vars(mod).get("Task")
    return snap


@pytest.fixture(autouse=True)
def _not_installed_session_wide() -> None:
    skip_if_installed_for_session()


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


def test_off_patches_nothing_and_exit_restores_originals() -> None:
    before = _snapshot()
    assert not sanitizer._instrument.patched()
    with sanitize("off"):
        assert _same(_snapshot(), before)
    with sanitize("raise"):
        during = _snapshot()
        assert not _same(during, before)
        assert asyncio.Future is not before["asyncio.Future"]
        assert asyncio.Event.__dict__["set"] is not before["Event.set"]
    after = _snapshot()
    assert _same(after, before), {k for k in after if after.get(k) is not before.get(k)}
    assert asyncio.Future is before["asyncio.Future"]
    assert asyncio.Task is before["asyncio.Task"]


def test_install_uninstall_and_nesting() -> None:
    before = _snapshot()
    install("warn")
    try:
        with sanitize("raise") as outer:
            emitter = sanitizer._report.emitter
            with sanitize("log") as inner:
                assert emitter.policy == "log"
            assert str(emitter.policy) == "raise"
            with sanitize("off"):
                assert not sanitizer._instrument._active
            assert sanitizer._instrument._active
            assert outer.reports == [] and inner.reports == []
        assert sanitizer._report.emitter.policy == "warn"
        assert sanitizer._instrument.patched()
    finally:
        uninstall()
    assert _same(_snapshot(), before)


def test_nested_block_policy_and_reports_go_to_innermost() -> None:
    with LoopInThread("owner") as owner, sanitize("raise") as outer:
        fut: asyncio.Future[int] = owner.call(owner.loop.create_future)
        with sanitize("log") as inner:
            in_thread(lambda: fut.set_result(1))  # log: does not raise
        assert len(inner.reports) == 1 and outer.reports == []
        fut2: asyncio.Future[int] = owner.call(owner.loop.create_future)
        with pytest.raises(SanitizerError):
            in_thread(lambda: fut2.set_result(1))
        assert len(outer.reports) == 1
        owner.loop.call_soon_threadsafe(fut2.cancel)


def test_isinstance_still_holds_for_futures_made_before() -> None:
    loop = asyncio.new_event_loop()
    try:
        plain = loop.create_future()
        with sanitize("raise"):
            ours = loop.create_future()
            assert type(ours) is not type(plain)
            assert isinstance(plain, asyncio.Future) and isinstance(ours, asyncio.Future)
            assert issubclass(type(plain), asyncio.Future)

            async def noop() -> None:
                pass

            task = loop.create_task(noop())
            assert isinstance(task, asyncio.Task) and isinstance(task, asyncio.Future)
            loop.run_until_complete(task)
    finally:
        loop.close()


def test_bad_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="raise, warn, log, off"):
        sanitize("explode")  # type: ignore[arg-type]
    env = {"LOOPBRIDGE_SANITIZE": "loud"}
    with pytest.raises(ValueError, match="LOOPBRIDGE_SANITIZE='loud'"):
        install_from_env(env)
    assert install_from_env({"LOOPBRIDGE_SANITIZE": "off"}) is None
    assert not sanitizer._instrument.patched()


_CHILD_MODULE = '''
import asyncio, sys, threading

def misuse():
    """Foreign-thread Event.set; returns the exception class name or None."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    loop.call_soon(started.set)
    t = threading.Thread(target=loop.run_forever, name="owner")
    t.start()
    started.wait(5)
    ev = asyncio.run_coroutine_threadsafe(_make(), loop).result(5)
    try:
        ev.set()
        result = None
    except Exception as exc:
        result = type(exc).__name__
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)
    loop.close()
    return result

async def _make():
    ev = asyncio.Event()
    asyncio.ensure_future(ev.wait())
    await asyncio.sleep(0)
    return ev

def child_entry(queue):
    queue.put({"error": misuse(), "loopbridge_imported_by_target": False})
'''

_MAIN = """
import json, multiprocessing, sys
{import_line}
import child_mod

if __name__ == "__main__":
    own = child_mod.misuse()
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child_mod.child_entry, args=(q,))
    p.start()
    child = q.get(timeout=60)
    p.join(60)
    print(json.dumps({{"main": own, "child": child["error"]}}))
"""


def _run(tmp_path: Path, import_line: str, env_extra: dict[str, str]) -> dict[str, Any]:
    (tmp_path / "child_mod.py").write_text(textwrap.dedent(_CHILD_MODULE))
    (tmp_path / "main.py").write_text(_MAIN.format(import_line=import_line))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOOPBRIDGE_SANITIZE")}
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "main.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_env_var_with_import_activates_process_and_spawned_child(tmp_path: Path) -> None:
    """``LOOPBRIDGE_SANITIZE=raise`` and ``import loopbridge``: on in this
    process, and in a spawn child whose code never imports loopbridge (the way
    vLLM starts its EngineCore)."""
    result = _run(
        tmp_path, "import loopbridge", {"LOOPBRIDGE_SANITIZE": "raise", "PYTHONPATH": SRC}
    )
    assert result == {"main": "SanitizerError", "child": "SanitizerError"}


def test_env_var_alone_via_boot_dir(tmp_path: Path) -> None:
    """A process that never imports loopbridge: the boot directory on
    PYTHONPATH activates it at start-up."""
    path = os.pathsep.join([sanitizer.boot_dir(), SRC])
    result = _run(tmp_path, "", {"LOOPBRIDGE_SANITIZE": "raise", "PYTHONPATH": path})
    assert result == {"main": "SanitizerError", "child": "SanitizerError"}


def test_without_env_var_nothing_happens(tmp_path: Path) -> None:
    result = _run(tmp_path, "import loopbridge", {"PYTHONPATH": SRC})
    assert result == {"main": None, "child": None}


def test_boot_chains_to_an_existing_sitecustomize(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.CHAINED = True\n")
    path = os.pathsep.join([sanitizer.boot_dir(), str(other), SRC])
    code = (
        "import builtins, asyncio, sys; "
        "print(getattr(builtins, 'CHAINED', False), 'loopbridge' in sys.modules, "
        "asyncio.Future.__name__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"LOOPBRIDGE_SANITIZE": "warn", "PYTHONPATH": path})
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "SanFuture"]
