"""Fixtures for the SGLang adapter's tests: the real ``TokenizerManager`` on CPU.

Each test builds its own manager (SGLang publishes its server arguments process-wide,
so managers are built one at a time, on the main thread) against its own stand-in
scheduler process (``loopbridge_sglang.cpu_manager``), with IPC sockets in the test's
temporary directory.

SGLang's ``print_exception_wrapper`` kills the whole process tree when ``handle_loop``
raises. Here it is replaced by a recorder (:class:`Crashes`) for every test, so a test
can name the failure instead of dying with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Not "sglang": with tests/ on sys.path, this folder itself imports under that name.
pytest.importorskip(
    "sglang.srt.managers.tokenizer_manager",
    reason="the SGLang lane's venv (.venv-sglang) has SGLang",
)

from sglang.srt.managers import tokenizer_manager as tm_module

from loopbridge import LoopThread
from loopbridge_sglang.cpu_manager import (
    StandInScheduler,
    build_tiny_model,
    make_tokenizer_manager,
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


class Crashes:
    """What reached SGLang's print_exception_wrapper (which would kill the process)."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.where: list[str] = []  # the manager's task that raised: "handle_loop", ...
        self.seen = threading.Event()

    async def wrapper(self, func: Any) -> None:
        try:
            await func()
        except Exception as exc:  # SGLang: log, dump, kill_process_tree, exit
            self.errors.append(exc)
            self.where.append(getattr(func, "__name__", repr(func)))
            self.seen.set()


@pytest.fixture(autouse=True)
def crashes(monkeypatch: pytest.MonkeyPatch) -> Crashes:
    recorder = Crashes()
    monkeypatch.setattr(tm_module, "print_exception_wrapper", recorder.wrapper)
    return recorder


@dataclass
class Manager:
    """A real TokenizerManager with its stand-in scheduler."""

    manager: Any
    scheduler: StandInScheduler
    server_args: Any
    port_args: Any


@contextlib.contextmanager
def real_manager(tiny_model: Path, ipc_dir: Path, step_s: float = 0.0) -> Iterator[Manager]:
    manager, server_args, port_args = make_tokenizer_manager(tiny_model, ipc_dir)
    scheduler = StandInScheduler(port_args, step_s=step_s).start()
    try:
        yield Manager(manager, scheduler, server_args, port_args)
    finally:
        scheduler.stop()
        for sock in (manager.send_to_scheduler, manager.recv_from_detokenizer):
            sock.close(linger=0)


@pytest.fixture
def sgl(tiny_model: Path, tmp_path: Path) -> Iterator[Manager]:
    with real_manager(tiny_model, tmp_path / "ipc") as m:
        yield m


@pytest.fixture
def paced(tiny_model: Path, tmp_path: Path) -> Iterator[Manager]:
    """A stand-in that takes 2 ms per step: a long request stays in flight for seconds."""
    with real_manager(tiny_model, tmp_path / "ipc", step_s=0.002) as m:
        yield m


@pytest.fixture
def owner() -> Iterator[LoopThread]:
    # asyncio's own loop (SGLang installs uvloop's policy on import): the race test
    # relies on asyncio's debug-mode thread check.
    thread = LoopThread("sglang-owner", loop_factory=asyncio.SelectorEventLoop).start()
    yield thread
    thread.stop()


@pytest.fixture
def server_loop() -> Iterator[LoopThread]:
    """A second loop on its own thread, as an HTTP server's; asyncio debug mode on."""
    thread = LoopThread("sglang-server", loop_factory=asyncio.SelectorEventLoop).start()
    thread.loop.call_soon_threadsafe(thread.loop.set_debug, True)
    yield thread
    with contextlib.suppress(TimeoutError):  # the raw race test leaves it stuck, and says so
        thread.stop()


class _NotifyingWaiters(collections.deque):  # type: ignore[type-arg]
    """An asyncio.Event's waiter deque that reports each waiter once it is parked."""

    def __init__(self, hook: ReqStateHook) -> None:
        super().__init__()
        self.hook = hook

    def append(self, fut: Any) -> None:
        super().append(fut)
        self.hook.parked(fut)


@dataclass
class ReqStateHook:
    """Every ReqState's event, watched: where its waiters park, who sets it."""

    waiter_loops: list[asyncio.AbstractEventLoop] = field(default_factory=list)
    sets: int = 0
    foreign_sets: int = 0  # set() on a thread other than the waiter's loop thread
    _parked: threading.Condition = field(default_factory=threading.Condition)

    def parked(self, fut: Any) -> None:
        with self._parked:
            self.waiter_loops.append(fut.get_loop())
            self._parked.notify_all()

    def wait_parked(self, n: int, timeout: float = 60.0) -> None:
        with self._parked:
            if not self._parked.wait_for(lambda: len(self.waiter_loops) >= n, timeout):
                raise TimeoutError(f"{len(self.waiter_loops)} of {n} requests parked")

    def watch(self, event: asyncio.Event) -> None:
        event._waiters = _NotifyingWaiters(self)  # type: ignore[attr-defined]
        original = event.set

        def set_() -> None:
            self.sets += 1
            for fut in list(event._waiters):  # type: ignore[attr-defined]
                loop = fut.get_loop()
                if getattr(loop, "_thread_id", None) != threading.get_ident():
                    self.foreign_sets += 1
            original()

        event.set = set_  # type: ignore[method-assign]


@pytest.fixture
def req_state_hook(monkeypatch: pytest.MonkeyPatch) -> ReqStateHook:
    hook = ReqStateHook()
    base = tm_module.ReqState

    class WatchedReqState(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            hook.watch(self.event)

    monkeypatch.setattr(tm_module, "ReqState", WatchedReqState)
    return hook


def open_requests_after_barrier(owner: LoopThread, manager: Any) -> int:
    """How many requests the manager still tracks once it read every earlier reply.

    The stand-in answers on one ZMQ PUSH socket, which keeps order: once a new
    one-token request has completed on the owner loop, every reply sent before it
    (an abort's final output, say) has been handled too. The scheduler must not be
    held.
    """
    from sglang.srt.managers.io_struct import GenerateReqInput

    async def barrier() -> int:
        obj = GenerateReqInput(input_ids=[1], sampling_params={"max_new_tokens": 1})
        async for _ in manager.generate_request(obj):
            pass
        return len(manager.rid_to_state)

    return owner.run(barrier)
