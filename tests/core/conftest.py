from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, ClassVar, TypeVar

import pytest

import loopbridge as lb
import loopbridge.metrics

T = TypeVar("T")


@lb.loop_affine(stable=("name",), threadsafe=("describe",))
class Engine:
    """A small loop-affine object with every kind of member."""

    def __init__(self, name: str = "engine") -> None:
        self.name = name
        self.log: list[Any] = []
        self.counter = 0
        # Set on the owner loop when a member starts: tests wait for these
        # instead of sleeping until the call has probably got there.
        self.started = {"sleep": threading.Event(), "count": threading.Event()}
        self.count_finished = threading.Event()  # count()'s finally has run

    def describe(self) -> str:
        return f"engine {self.name}"

    def bump(self) -> int:  # sync, not declared: refused through a proxy
        self.counter += 1
        return self.counter

    async def echo(self, value: Any) -> Any:
        return value

    async def where(self) -> asyncio.AbstractEventLoop:
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    async def fail(self, message: str) -> None:
        await asyncio.sleep(0)
        raise ValueError(message)

    async def sleep(self, seconds: float) -> str:
        self.started["sleep"].set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError as exc:
            self.log.append(("cancelled", exc.args, asyncio.get_running_loop()))
            await asyncio.sleep(0.01)  # cleanup that takes a while, on the loop
            self.log.append(("cleanup done", asyncio.get_running_loop()))
            raise
        return "slept"

    async def count(self, n: int, delay: float = 0.0) -> AsyncIterator[int]:
        self.started["count"].set()
        try:
            for i in range(n):
                if delay:
                    await asyncio.sleep(delay)
                yield i
        except GeneratorExit:
            self.log.append(("generator exit", asyncio.get_running_loop()))
            raise
        except asyncio.CancelledError:
            self.log.append(("generator cancelled", asyncio.get_running_loop()))
            raise
        finally:
            self.log.append(("finally", asyncio.get_running_loop()))
            self.count_finished.set()


@lb.loop_affine
class Adder:
    """Async members with every kind of parameter."""

    async def add(self, a: int, b: int = 1, *rest: int, scale: int = 1, **extra: int) -> int:
        return (a + b + sum(rest) + sum(extra.values())) * scale

    async def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


@pytest.fixture
def ctrl_c_raises() -> Iterator[threading.Event]:
    """SIGINT raises ``KeyboardInterrupt`` in the main thread, as at a terminal, once:
    the event it gives is set when it has, and later ones do nothing (see
    ``interleave.ctrl_c``, which sends it again until then).

    A test run started in the background of a non-interactive shell (as CI starts
    each Python's core lane) inherits SIGINT ignored, and Python then leaves it
    ignored: ``_thread.interrupt_main()`` would do nothing. The previous handler
    is put back afterwards.
    """
    raised = threading.Event()

    def once(signum: int, frame: object) -> None:
        if not raised.is_set():
            raised.set()
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, once)
    try:
        yield raised
    finally:
        signal.signal(signal.SIGINT, previous)


async def until_set(event: threading.Event, timeout: float = 30.0) -> None:
    """Wait, without blocking the running loop, for an event another thread sets."""
    if not await asyncio.to_thread(event.wait, timeout):
        raise AssertionError(f"not set within {timeout} s")


def hang_dump(what: str) -> str:
    """Print loopbridge's hang dump (what each parked caller waits on) to stderr,
    where pytest shows it with the failure; return the failure message."""
    sys.stderr.write(f"{what}: loopbridge hang dump follows\n{lb.metrics.format_inflight()}")
    sys.stderr.flush()
    return f"{what} (loopbridge's hang dump is in the captured stderr)"


async def within(aw: Awaitable[T], seconds: float, what: str = "hung") -> T:
    """``asyncio.wait_for`` that prints the hang dump before failing on a hang."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:  # TimeoutError itself from 3.11 on
        raise AssertionError(hang_dump(f"{what}: not done within {seconds} s")) from None


async def make_engine(name: str = "engine") -> Engine:
    """An :class:`Engine` owned by the loop that runs this."""
    return Engine(name)


@pytest.fixture
def engine(owner: lb.LoopThread) -> Engine:
    return owner.run(make_engine)


@lb.loop_affine
class Service:
    """Issue 33's smaller holes (point 10): async class-level members, results that
    hold fresh loop-bound state, an owner method that raises ``SystemExit``."""

    registry: ClassVar[list[tuple[str, asyncio.AbstractEventLoop]]] = []

    async def get(self) -> int:
        return 1

    async def fresh_queue(self) -> asyncio.Queue[int]:
        return asyncio.Queue()

    async def fresh_event_holder(self) -> Any:
        return Holder()

    @classmethod
    async def register(cls, name: str) -> tuple[type, asyncio.AbstractEventLoop]:
        cls.registry.append((name, asyncio.get_running_loop()))
        return cls, asyncio.get_running_loop()

    @staticmethod
    async def version() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    @classmethod
    async def names(cls) -> AsyncIterator[tuple[type, asyncio.AbstractEventLoop]]:
        yield cls, asyncio.get_running_loop()

    async def exit(self) -> None:
        raise SystemExit(3)


class Holder:
    def __init__(self) -> None:
        self.ready = asyncio.Event()  # not bound to any loop until first used


@pytest.fixture
def service(owner: lb.LoopThread) -> Service:
    async def make() -> Service:
        return Service()

    return owner.run(make)


async def cancel_once_sleeping(p: Engine, engine: Engine, msg: str) -> None:
    """Call ``p.sleep(30)``, cancel the caller once the owner runs it, and check
    that the owner's cleanup finished before the caller's cancellation did."""
    task = asyncio.create_task(p.sleep(30))
    await until_set(engine.started["sleep"])
    task.cancel(msg)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.log[0][:2] == ("cancelled", (msg,))
    assert engine.log[1][0] == "cleanup done"


def tasks_on(loop: asyncio.AbstractEventLoop) -> set[asyncio.Task[Any]]:
    """Pending tasks on a loop other than loopbridge's own keeper."""

    async def collect() -> set[asyncio.Task[Any]]:
        me = asyncio.current_task()
        return {
            t for t in asyncio.all_tasks() if t is not me and t.get_name() != "loopbridge-keeper"
        }

    return asyncio.run_coroutine_threadsafe(collect(), loop).result(5)
