"""Fixtures shared by the core and metrics suites: owner loops on their own
threads, and a check that a test leaves no thread behind.

Hypothesis runs derandomized by default, so a run (CI's included) tries the same
examples every time and a failure reproduces. For random exploration, new
examples on every run::

    HYPOTHESIS_PROFILE=explore pytest tests/core/test_stress.py
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import loopbridge as lb
from loopbridge._watchdog import THREAD_NAME as WATCHDOG_THREAD_NAME

settings.register_profile("derandomized", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))

HERE = Path(__file__).resolve().parent

#: The suites that need an engine, by engine; their tests carry the engine's
#: marker (``-m vllm``, ``-m sglang``), and where the engine is not installed
#: they are not collected at all. The one list every lane selects by.
ENGINE_SUITES = {
    "vllm": ("vllm", "dp", "bench", "sanitizer/test_vllm_pattern.py"),
    "sglang": ("sglang",),
}
# Installed distributions, not find_spec: with tests/ on sys.path, tests/vllm and
# tests/sglang would pass for the engines themselves.
_installed = importlib.metadata.packages_distributions()
collect_ignore = [
    path for engine, paths in ENGINE_SUITES.items() if engine not in _installed for path in paths
]

if "vllm" in _installed:
    # Before any suite imports vLLM (some releases resolve their platform at
    # import): the CPU platform, and vLLM's caches inside the work tree.
    from loopbridge_vllm.cpu_engine import cpu_engine_env

    cpu_engine_env(HERE.parent / ".cache" / "vllm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for engine, paths in ENGINE_SUITES.items():
            suites = [HERE / path for path in paths]
            if any(item.path == suite or suite in item.path.parents for suite in suites):
                item.add_marker(engine)


# Suites whose tests must end every thread they start (the vLLM ones keep an
# engine alive across tests on purpose).
_THREAD_CHECKED = (HERE / "core", HERE / "metrics")
# ... but for the process's one watchdog of blocked thread callers, which stays, and
# sleeps while none waits (tests/core/test_watchdog.py).


def _make_owner(kind: str) -> lb.LoopThread:
    return lb.LoopThread(name=f"owner-{kind}", use_uvloop=(kind == "uvloop")).start()


@pytest.fixture(params=["asyncio", "uvloop"])
def owner(request: pytest.FixtureRequest) -> Iterator[lb.LoopThread]:
    t = _make_owner(request.param)
    yield t
    t.stop()


@pytest.fixture
def asyncio_owner() -> Iterator[lb.LoopThread]:
    t = _make_owner("asyncio")
    yield t
    t.stop()


@pytest.fixture(autouse=True)
def no_leaked_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    if not any(d in request.node.path.parents for d in _THREAD_CHECKED):
        yield
        return
    before = set(threading.enumerate())
    yield
    gc.collect()
    extra: list[threading.Thread] = []
    for _ in range(100):  # threads told to stop may take a moment to end
        extra = [
            t
            for t in threading.enumerate()
            if t not in before and t.is_alive() and t.name != WATCHDOG_THREAD_NAME
        ]
        if not extra:
            break
        threading.Event().wait(0.02)
    assert not extra, f"leaked threads: {extra}"
