from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

import loopbridge as lb
from loopbridge.metrics import record_submission_sites


@pytest.fixture(params=["asyncio", "uvloop"])
def owner(request: pytest.FixtureRequest) -> Iterator[lb.LoopThread]:
    t = lb.LoopThread(name=f"owner-{request.param}", use_uvloop=request.param == "uvloop").start()
    yield t
    t.stop()


@pytest.fixture
def asyncio_owner() -> Iterator[lb.LoopThread]:
    t = lb.LoopThread(name="owner-asyncio").start()
    yield t
    t.stop()


@pytest.fixture
def sites() -> Iterator[None]:
    old = record_submission_sites(True)
    yield
    record_submission_sites(old)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    gc.collect()
    wait = threading.Event()
    extra: list[threading.Thread] = []
    for _ in range(100):
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra:
            break
        wait.wait(0.02)
    assert not extra, f"leaked threads: {extra}"
