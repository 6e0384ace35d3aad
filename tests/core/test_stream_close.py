"""A stream after ``aclose()``, ``athrow()``, ``close()`` or a cancel: a native generator's end.

A native async generator, once closed (``aclose()``, an ``athrow()`` it does not
handle, a cancel that went through it), raises ``StopAsyncIteration`` from every
later ``__anext__``; ``aclose()`` is then a no-op and ``athrow()`` returns None.
A proxied stream must do the same, whether its owner side was still running when
it was closed or had already finished, with items buffered that the consumer
never took.  Each test runs the same steps on a native generator and compares.

On 45500bb the next ``__anext__`` raised ``CancelledError`` into a task nobody
cancelled (the owner side's CANCELLED outcome, re-raised), or, when the owner side
had finished, went on handing out the buffered items.

The metrics count how the consumer left: a ``break`` or ``aclose()`` after 1 of
100 items is a cancelled stream (and ``aclose()`` a consumer close) even when the
owner side had already produced all 100; on 45500bb it counted a completion.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

import loopbridge as lb
import loopbridge.metrics

from .conftest import Engine
from .interleave import Countdown, Interleaving

N = 100
FOREVER = 10**9

Result = tuple[str, object]


async def _outcome(aw: Awaitable[Any]) -> Result:
    try:
        return ("returned", await aw)
    except BaseException as exc:
        return ("raised", type(exc).__name__)


def _sync_outcome(fn: Callable[[], Any]) -> Result:
    try:
        return ("returned", fn())
    except BaseException as exc:
        return ("raised", type(exc).__name__)


async def _native(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


def _native_sync(n: int) -> Iterator[int]:
    yield from range(n)


# ------------------------------------------------------------------ the pump done
class PumpDone:
    """Synchronise on a stream's owner side having settled (``settle.latched``,
    passed on the owner thread) and the step that settled it having ended."""

    def __init__(self, il: Interleaving, owner: lb.LoopThread) -> None:
        self.countdown: Countdown = il.count("settle.latched", 1, owner.thread)

    def wait(self, p: Any) -> None:
        """From a plain thread."""
        self.countdown.wait()
        lb.blocking(p).echo(None)  # runs on the owner after the step that settled

    async def wait_async(self, p: Any) -> None:
        await asyncio.to_thread(self.countdown.wait)
        await p.echo(None)


def _stream(p: Any, state: str) -> Any:
    return p.count(N if state == "finished" else FOREVER)


def _proxy(engine: Engine) -> Any:
    # A window past N: a finished owner side leaves N - 1 items buffered.
    return lb.proxy(engine, stream_window=N + 28)


# ------------------------------------------------------------ asyncio and trio
async def _steps(stream: Any, op: str, ready: Callable[[], Awaitable[None]]) -> list[Result]:
    """Take one item, close it by ``op``, then what a consumer might do next."""
    out = [await _outcome(stream.__anext__())]
    await ready()
    if op == "aclose":
        out.append(await _outcome(stream.aclose()))
    else:
        out.append(await _outcome(stream.athrow(ValueError("stop"))))
    out += [
        await _outcome(stream.__anext__()),
        await _outcome(stream.__anext__()),
        await _outcome(stream.asend(None)),
        await _outcome(stream.athrow(ValueError("again"))),
        await _outcome(stream.aclose()),
        await _outcome(stream.__anext__()),
    ]
    return out


async def _nothing() -> None:
    pass


@pytest.mark.parametrize("state", ["running", "finished"])
@pytest.mark.parametrize("op", ["aclose", "athrow"])
def test_after_close_the_stream_ends_as_a_native_generator(
    owner: lb.LoopThread, engine: Engine, op: str, state: str
) -> None:
    native = asyncio.run(_steps(_native(N), op, _nothing))
    p = _proxy(engine)
    with Interleaving() as il:
        done = PumpDone(il, owner)

        async def main() -> list[Result]:
            ready = (lambda: done.wait_async(p)) if state == "finished" else _nothing
            return await _steps(_stream(p, state), op, ready)

        got = asyncio.run(main())
    assert got == native
    assert native[2:4] == [("raised", "StopAsyncIteration")] * 2
    assert ("finally", owner.loop) in engine.log  # closed on its owner, as ever


@pytest.mark.parametrize("state", ["running", "finished"])
@pytest.mark.parametrize("op", ["aclose", "athrow"])
def test_after_close_from_trio(owner: lb.LoopThread, engine: Engine, op: str, state: str) -> None:
    trio = pytest.importorskip("trio")
    native = trio.run(_steps, _native(N), op, _nothing)
    p = _proxy(engine)
    with Interleaving() as il:
        done = PumpDone(il, owner)

        async def ready() -> None:
            if state == "finished":
                done.countdown.wait()  # blocks trio a moment: the owner needs nothing of it
                await p.echo(None)

        got = trio.run(_steps, _stream(p, state), op, ready)
    assert got == native


@lb.loop_affine
class Slow:
    """One item, then a wait that only a cancel ends."""

    async def items(self) -> AsyncIterator[int]:
        yield 0
        await asyncio.sleep(3600)
        yield 1


async def _slow_native() -> AsyncIterator[int]:
    yield 0
    await asyncio.sleep(3600)
    yield 1


def test_a_cancelled_consumer_then_sees_the_end(owner: lb.LoopThread) -> None:
    """Cancelled while it waits: CancelledError there (it was cancelled), then the end."""

    async def steps(stream: Any, parked: Countdown | None) -> list[Result]:
        out = [await _outcome(stream.__anext__())]
        task = asyncio.ensure_future(stream.__anext__())
        if parked is not None:  # the consumer found no item 1 and parks
            await asyncio.to_thread(parked.wait)
        await asyncio.sleep(0)  # the task starts waiting (native: inside the generator)
        task.cancel()
        out.append(await _outcome(task))
        out += [await _outcome(stream.__anext__()), await _outcome(stream.aclose())]
        return out

    async def make() -> Slow:
        return Slow()

    native = asyncio.run(steps(_slow_native(), None))
    p = lb.proxy(owner.run(make))
    with Interleaving() as il:
        parked = il.count("stream.buffer_empty", 2)  # item 0's wait, then item 1's
        got = asyncio.run(steps(p.items(), parked))
    assert (
        got
        == native
        == [
            ("returned", 0),
            ("raised", "CancelledError"),
            ("raised", "StopAsyncIteration"),
            ("returned", None),
        ]
    )


# ------------------------------------------------------------- blocking face
def _blocking_steps(it: Any, ready: Callable[[], None]) -> list[Result]:
    out = [_sync_outcome(lambda: next(it))]
    ready()
    out += [
        _sync_outcome(it.close),
        _sync_outcome(lambda: next(it)),
        _sync_outcome(lambda: next(it)),
        _sync_outcome(it.close),
        _sync_outcome(lambda: next(it)),
    ]
    return out


@pytest.mark.parametrize("state", ["running", "finished"])
def test_blocking_close_ends_as_a_native_generator(
    owner: lb.LoopThread, engine: Engine, state: str
) -> None:
    native = _blocking_steps(_native_sync(N), lambda: None)
    p = _proxy(engine)
    out: list[list[Result]] = []
    with Interleaving() as il:
        done = PumpDone(il, owner)
        ready = (lambda: done.wait(p)) if state == "finished" else (lambda: None)
        it = lb.blocking(p).count(N if state == "finished" else FOREVER)
        t = threading.Thread(target=lambda: out.append(_blocking_steps(it, ready)))
        t.start()
        t.join(30)
    assert out == [native]
    assert native[2:4] == [("raised", "StopIteration")] * 2


# ----------------------------------------------------------------- the metrics
def _counts(p: Any) -> dict[str, int]:
    s = lb.metrics.metrics_of(p).snapshot()
    keys = ("streams", "streams_completed", "streams_cancelled", "consumer_closes", "streams_open")
    return {k: s[k] for k in keys}


def _leave(how: str, p: Any, done: PumpDone) -> None:
    """Take 1 of N items once the owner side has produced all N, then leave by ``how``."""

    async def main() -> None:
        if how == "break":
            async for _ in p.count(N):
                await done.wait_async(p)
                break
            gc.collect()
        elif how == "aclose":
            stream = p.count(N)
            await stream.__anext__()
            await done.wait_async(p)
            await stream.aclose()
        elif how == "drain":
            assert [i async for i in p.count(N)] == list(range(N))
        else:  # took every item, closed before it saw the end
            stream = p.count(N)
            assert [await stream.__anext__() for _ in range(N)] == list(range(N))
            await done.wait_async(p)
            await stream.aclose()

    if how == "close":
        with lb.blocking(p).count(N) as it:
            next(it)
            done.wait(p)
    else:
        asyncio.run(main())


CASES = {
    "break": {"streams_cancelled": 1, "consumer_closes": 0, "streams_completed": 0},
    "aclose": {"streams_cancelled": 1, "consumer_closes": 1, "streams_completed": 0},
    "close": {"streams_cancelled": 1, "consumer_closes": 1, "streams_completed": 0},
    "drain": {"streams_cancelled": 0, "consumer_closes": 0, "streams_completed": 1},
    "took_all": {"streams_cancelled": 0, "consumer_closes": 0, "streams_completed": 1},
}


@pytest.mark.parametrize("how", list(CASES))
def test_metrics_count_how_the_consumer_left(
    owner: lb.LoopThread, engine: Engine, how: str
) -> None:
    p = _proxy(engine)
    with Interleaving() as il:
        _leave(how, p, PumpDone(il, owner))
    assert _counts(p) == {"streams": 1, "streams_open": 0, **CASES[how]}
    assert engine.log[-1] == ("finally", owner.loop)


def test_metrics_of_a_break_while_the_owner_side_runs(owner: lb.LoopThread, engine: Engine) -> None:
    """The control: left while the owner side still runs, as counted before."""
    p = _proxy(engine)

    async def main() -> None:
        async for _ in p.count(FOREVER, delay=0.001):
            break
        gc.collect()
        await asyncio.to_thread(engine.count_finished.wait, 30)

    with Interleaving() as il:
        settled = il.count("settle.latched", 1, owner.thread)
        asyncio.run(main())
        settled.wait()
        lb.blocking(p).echo(None)
    assert _counts(p) == {
        "streams": 1,
        "streams_open": 0,
        "streams_cancelled": 1,
        "consumer_closes": 0,
        "streams_completed": 0,
    }
