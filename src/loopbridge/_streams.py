"""Async generators across loops: a pump on the owner, a credit window, batched wake-ups.

The owner side is a *pump* task on the owner loop.  It iterates the real async
generator and appends each item to a buffer shared with the consumer.  The
consumer pops items from that buffer without any hand-off per item; it only
parks (and needs a wake-up) when the buffer is empty.  So while the consumer is
busy, items pile up and are handed over with one cross-thread wake-up.

Back-pressure is a credit window: the pump suspends once it is ``window`` items
ahead of what the consumer has acknowledged.  The consumer acknowledges in
batches of half a window (and whenever it parks), so the producer is woken at
most twice per window.

Closing (``aclose()``, ``break`` out of ``async for``, cancellation, garbage
collection) cancels the pump *on the owner loop*; the pump then closes the
generator there, so its ``finally`` blocks and ``except GeneratorExit`` /
``except CancelledError`` handlers run on the loop that owns its state.  This is
how vLLM's ``generate()`` aborts a request.

Flag protocol (GIL-ordered, no lock): the side that parks sets its waiter, then
its ``parked`` flag, then re-checks the condition; the side that makes progress
changes the condition, then tests the flag.  One of the two always sees the other.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from ._calls import annotate
from ._construction import NoPublicConstructor
from ._diagnose import submission_site, tracing
from ._eager import start_task
from ._errors import LoopAffinityError
from ._labels import thread_name as _thread_name
from ._metrics import Metrics
from ._ports import LIVENESS_INTERVAL, Port, get_running_loop, running_port

__all__ = ["RemoteStream", "BlockingStream", "Channel"]

Y = TypeVar("Y")
_perf = time.perf_counter

_DONE, _ERROR, _CANCELLED = 1, 2, 3


class Channel:
    """State shared by the pump (owner loop) and one consumer (any thread)."""

    __slots__ = (
        "fn",
        "args",
        "kwargs",
        "ctx",
        "what",
        "own",
        "owner",
        "window",
        "ack_every",
        "buf",
        "acked",
        "end",
        "end_value",
        "consumer_parked",
        "producer_parked",
        "producer_waiter",
        "wake_consumer",
        "consumer_waiter",
        "pump",
        "closing",
        "stats",
        "t_submit",
        "t_start",
        "t_end",
        "submitted_from",
        "caller_label",
        "counted",
        "site",
        "agen",
        "t_parked",
        "__weakref__",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        what: str,
        own: Any,
        window: int,
        stats: Metrics,
    ) -> None:
        if window < 1:
            raise ValueError(f"stream window must be at least 1, not {window}")
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.ctx = contextvars.copy_context()
        self.what = what
        self.own = own
        self.owner: Port | None = None
        self.window = window
        self.ack_every = max(1, window // 2)
        self.buf: deque[Any] = deque()
        self.acked = 0  # items the consumer has taken, as last published
        self.end = 0
        self.end_value: Any = None
        self.consumer_parked = False
        self.producer_parked = False
        self.producer_waiter: asyncio.Future[None] | None = None
        self.wake_consumer: Callable[[], None] = _noop
        # asyncio future or trio event the consumer parks on (consumer thread only)
        self.consumer_waiter: Any = None
        self.pump: asyncio.Task[None] | None = None
        self.closing: str | bool | None = False
        self.stats = stats
        self.t_submit = _perf()
        self.t_start = 0.0
        self.t_end = 0.0
        self.submitted_from = threading.get_ident()
        self.caller_label = ""
        # Metrics and hang dumps only: items already counted as delivered, where
        # the stream was opened, the generator, when the consumer last parked.
        self.counted = 0
        self.site = submission_site() if tracing.on else None
        self.agen: Any = None
        self.t_parked = 0.0

    def open(self) -> None:
        owner = self.own.port()
        self.owner = owner
        self.stats.stream_started()
        try:
            owner.submit(self, _start_pump)
        except BaseException:
            self.stats.stream_finished(_ERROR, self)
            raise

    # -- any thread ---------------------------------------------------------
    def finish(self, kind: int, value: Any) -> None:
        """Record how the stream ended (first writer wins) and wake the consumer."""
        if self.end:
            return
        self.end_value = value
        self.end = kind
        self.t_end = _perf()
        if self.owner is not None:
            self.owner.done(self)
        self.stats.stream_finished(kind, self)
        if self.consumer_parked:
            self.consumer_parked = False
            self.wake_consumer()

    def owner_died(self, exc: BaseException) -> None:
        self.finish(_ERROR, exc)

    def describe(self) -> dict[str, Any]:
        now = _perf()
        return {
            "kind": "stream",
            "what": self.what,
            "caller": self.caller_label,
            "owner": self.owner.label if self.owner else None,
            "submitted_from_thread": _thread_name(self.submitted_from),
            "waiting_s": round(now - self.t_submit, 6),
            "started": bool(self.t_start),
            "buffered": len(self.buf),
            "consumer_parked": self.consumer_parked,
            "producer_parked": self.producer_parked,
        }

    def delivered(self, taken: int) -> None:
        """Count the items the consumer took since it last parked (consumer side)."""
        n = taken - self.counted
        if n > 0:
            self.counted = taken
            self.stats.stream_batch(n)

    def request_close(self, msg: str | None) -> None:
        """Ask the owner to close the generator (any thread, never blocks)."""
        if self.end or self.closing is not False or self.owner is None:
            return
        self.closing = msg
        try:
            self.owner.post(_close_on_owner, self)
        except BaseException:
            pass

    def ack(self, taken: int) -> None:
        """Publish consumption; wake the producer if it waits for credit."""
        self.acked = taken
        if self.producer_parked:
            self.producer_parked = False
            owner = self.owner
            if owner is not None:
                try:
                    owner.post(_wake_producer, self)
                except BaseException:
                    pass

    def raise_end(self) -> None:
        kind, value = self.end, self.end_value
        if kind == _DONE:
            raise StopAsyncIteration
        if kind == _CANCELLED:
            raise asyncio.CancelledError(*value.args)
        annotate(value, self.what, self.owner)  # type: ignore[arg-type]
        raise value


def _noop() -> None:
    pass


# ------------------------------------------------------------- owner side
def _start_pump(ch: Channel) -> None:
    owner = ch.owner
    assert owner is not None
    if ch.end:
        return
    if ch.own.loop is not owner.loop:  # transferred meanwhile: follow the owner
        owner.done(ch)
        try:
            ch.owner = port = ch.own.port()
            port.submit(ch, _start_pump)
        except BaseException as exc:
            ch.finish(_ERROR, exc)
        return
    if ch.closing is not False:
        ch.finish(_CANCELLED, asyncio.CancelledError(ch.closing))
        return
    ch.t_start = _perf()
    loop = owner.loop
    coro = _pump(ch, loop)
    ch.pump = start_task(loop, coro, ch.ctx)


async def _pump(ch: Channel, loop: asyncio.AbstractEventLoop) -> None:
    agen = ch.agen = ch.fn(*ch.args, **ch.kwargs)
    buf = ch.buf
    window = ch.window
    produced = 0
    try:
        async for item in agen:
            buf.append(item)
            produced += 1
            if ch.consumer_parked:
                ch.consumer_parked = False
                ch.wake_consumer()
            if ch.closing is not False:
                break
            if produced - ch.acked >= window:
                waiter = ch.producer_waiter = loop.create_future()
                ch.producer_parked = True
                if produced - ch.acked >= window:
                    await waiter
                ch.producer_parked = False
                ch.producer_waiter = None
                if ch.closing is not False:
                    break
    except asyncio.CancelledError as exc:
        await _aclose_quietly(agen)
        if ch.closing is not False:
            ch.finish(_CANCELLED, exc)
        else:
            loop.call_soon(_owner_cancelled, (ch, exc))
        raise
    except BaseException as exc:
        ch.finish(_ERROR, exc)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
    else:
        # Ended normally or by a close request between items: close the generator
        # here, on the owner loop, so its finally runs here.
        try:
            await agen.aclose()
        except BaseException as exc:
            ch.finish(_ERROR, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if ch.closing is not False:
            ch.finish(_CANCELLED, asyncio.CancelledError(ch.closing))
        else:
            ch.finish(_DONE, None)


async def _aclose_quietly(agen: Any) -> None:
    try:
        await agen.aclose()
    except BaseException:  # the generator's own error on close; the cancel wins
        pass


def _owner_cancelled(arg: tuple[Channel, asyncio.CancelledError]) -> None:
    ch, exc = arg
    owner = ch.owner
    if owner is not None and owner.die_if_shutting_down():
        dead = owner.dead
        assert dead is not None
        ch.finish(_ERROR, type(dead)(*dead.args))  # no-op: die() already failed it
        return
    ch.finish(_CANCELLED, exc)


def _wake_producer(ch: Channel) -> None:
    waiter = ch.producer_waiter
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _close_on_owner(ch: Channel) -> None:
    pump = ch.pump
    if pump is not None and not pump.done():
        msg = ch.closing if isinstance(ch.closing, str) else None
        pump.cancel(msg)
        # A pump cancelled before its first step never runs its handlers.
        pump.add_done_callback(lambda _: ch.finish(_CANCELLED, asyncio.CancelledError(msg)))
    elif pump is None and not ch.end:
        ch.finish(_CANCELLED, asyncio.CancelledError(ch.closing))


# ---------------------------------------------------------- asyncio/trio consumer
class RemoteStream(Generic[Y]):
    """What an async generator member returns through a proxy, off the owner loop.

    Behaves like an async generator object: ``async for``, ``__anext__``,
    ``asend(None)``, ``athrow`` and ``aclose``.  The owner-side generator starts
    when the first item is requested.
    """

    __slots__ = ("_ch", "_taken", "_loop", "_grace", "__weakref__")

    def __init__(self, ch: Channel, grace: float) -> None:
        self._ch = ch
        self._taken = 0
        self._loop: Any = None
        self._grace = grace

    def __repr__(self) -> str:
        return f"<loopbridge stream {self._ch.what}>"

    def __aiter__(self) -> RemoteStream[Y]:
        return self

    def _begin(self) -> None:
        ch = self._ch
        loop = get_running_loop()
        if loop is not None:
            port = running_port(loop)
            self._loop = loop

            # The wake closure must not reference this object: `break` out of
            # `async for` relies on refcounting to run __del__ promptly.
            def wake() -> None:
                port.post(_wake_consumer, ch)

            ch.caller_label = port.label
        else:
            from ._trio import current_library, trio_port

            if current_library() != "trio":
                raise LoopAffinityError(
                    f"iterating {ch.what} needs a running asyncio loop or trio; "
                    "from a plain thread use loopbridge.blocking(p)"
                )
            tport = trio_port()
            self._loop = "trio"

            def wake() -> None:
                tport.post(_wake_consumer, ch)

            ch.caller_label = tport.label
        ch.wake_consumer = wake
        ch.open()

    async def __anext__(self) -> Y:
        ch = self._ch
        buf = ch.buf
        if buf:  # fast path: no await, no wake-up
            self._taken += 1
            if self._taken - ch.acked >= ch.ack_every:
                ch.ack(self._taken)
            return buf.popleft()  # type: ignore[no-any-return]
        if self._loop is None:
            if ch.end:  # closed before it started
                ch.raise_end()
            self._begin()
        while True:
            if buf:
                self._taken += 1
                if self._taken - ch.acked >= ch.ack_every:
                    ch.ack(self._taken)
                return buf.popleft()  # type: ignore[no-any-return]
            ch.delivered(self._taken)
            if ch.end:  # the buffer is empty here: nothing left to drop
                ch.raise_end()
            ch.ack(self._taken)  # buffer empty: give the producer its full window
            await self._park()

    async def _park(self) -> None:
        ch = self._ch
        if self._loop == "trio":
            await self._park_trio()
            return
        loop = self._loop
        waiter = ch.consumer_waiter = loop.create_future()
        ch.t_parked = _perf()
        ch.consumer_parked = True
        if ch.buf or ch.end:
            ch.consumer_parked = False
            return
        port = running_port(loop)
        owner = ch.owner
        assert owner is not None
        port.watch(owner)
        try:
            await waiter
        except asyncio.CancelledError as exc:
            ch.consumer_parked = False
            await self._close_and_wait(exc.args[0] if exc.args else None)
            raise

    async def _park_trio(self) -> None:
        import trio

        ch = self._ch
        event = ch.consumer_waiter = trio.Event()
        ch.t_parked = _perf()
        ch.consumer_parked = True
        if ch.buf or ch.end:
            ch.consumer_parked = False
            return
        owner = ch.owner
        assert owner is not None
        try:
            while not event.is_set():
                with trio.move_on_after(LIVENESS_INTERVAL):
                    await event.wait()
                owner.check_alive()
        except trio.Cancelled:
            ch.consumer_parked = False
            await self._close_and_wait(None)
            raise

    async def _close_and_wait(self, msg: str | None) -> None:
        """Close the owner-side generator; wait (bounded) for its cleanup."""
        ch = self._ch
        ch.delivered(self._taken)
        if ch.end:
            return
        ch.stats.stream_closed()
        ch.request_close(msg)
        deadline = _perf() + self._grace
        if self._loop == "trio":
            import trio

            with trio.CancelScope(shield=True):
                while not ch.end and _perf() < deadline:
                    event = ch.consumer_waiter = trio.Event()
                    ch.consumer_parked = True
                    if ch.end:
                        break
                    with trio.move_on_after(min(LIVENESS_INTERVAL, self._grace)):
                        await event.wait()
                    ch.owner.check_alive()  # type: ignore[union-attr]
            ch.consumer_parked = False
            return
        loop = self._loop
        while not ch.end and _perf() < deadline:
            waiter = ch.consumer_waiter = loop.create_future()
            ch.consumer_parked = True
            if ch.end:
                break
            timer = loop.call_later(min(LIVENESS_INTERVAL, self._grace), _set_none, waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                break  # cancelled again: stop waiting
            finally:
                timer.cancel()
            ch.owner.check_alive()  # type: ignore[union-attr]
        ch.consumer_parked = False
        ch.buf.clear()

    async def aclose(self) -> None:
        """Close the owner-side generator on the owner loop and wait for its cleanup."""
        ch = self._ch
        ch.delivered(self._taken)
        if self._loop is None or ch.end:
            ch.end = ch.end or _DONE
            return
        await self._close_and_wait(None)
        ch.buf.clear()

    async def asend(self, value: None) -> Y:
        if value is not None:
            raise TypeError("a loopbridge stream only accepts asend(None): items are prefetched")
        return await self.__anext__()

    async def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> Y:
        await self.aclose()
        exc = (
            typ
            if isinstance(typ, BaseException)
            else (typ(val) if val is None or not isinstance(val, BaseException) else val)
        )
        raise exc

    def __del__(self) -> None:
        # Dropped without being exhausted or closed (e.g. `break` out of
        # `async for`): close the generator on its owner, without waiting.
        ch = self._ch
        if self._loop is not None:
            ch.delivered(self._taken)
            if not ch.end:
                ch.request_close(None)


def _wake_consumer(ch: Channel) -> None:
    waiter = ch.consumer_waiter
    if waiter is None:
        return
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            waiter.set_result(None)
    else:  # trio.Event
        waiter.set()


def _set_none(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


# ------------------------------------------------------------- thread consumer
class BlockingStream(Generic[Y], metaclass=NoPublicConstructor):
    """A blocking iterator over an owner-side async generator, for plain threads."""

    __slots__ = ("_ch", "_taken", "_lock", "_grace", "_started", "__weakref__")
    _lb_factory = "an async generator method of a loopbridge.blocking() face"

    def __init__(self, ch: Channel, grace: float) -> None:
        self._ch = ch
        self._taken = 0
        self._lock = threading.Lock()
        self._grace = grace
        self._started = False

    def __iter__(self) -> Iterator[Y]:
        return self

    def _begin(self) -> None:
        ch = self._ch
        loop = get_running_loop()
        if loop is not None and loop is ch.own.loop:
            raise LoopAffinityError(
                f"blocking iteration of {ch.what} on the owner loop's own thread would "
                "deadlock: use `async for` on loopbridge.proxy(obj) instead"
            )
        lock = self._lock
        lock.acquire()

        def wake() -> None:
            if lock.locked():
                try:
                    lock.release()
                except RuntimeError:  # already released by a racing wake
                    pass

        ch.wake_consumer = wake
        ch.caller_label = f"thread {threading.current_thread().name}"
        self._started = True
        ch.open()

    def __next__(self) -> Y:
        ch = self._ch
        if not self._started:
            if ch.end:
                raise StopIteration
            self._begin()
        buf = ch.buf
        while True:
            if buf:
                self._taken += 1
                if self._taken - ch.acked >= ch.ack_every:
                    ch.ack(self._taken)
                return buf.popleft()  # type: ignore[no-any-return]
            ch.delivered(self._taken)
            if ch.end:
                buf.clear()
                try:
                    ch.raise_end()
                except StopAsyncIteration:
                    raise StopIteration from None
            ch.ack(self._taken)
            self._park()

    def _park(self) -> None:
        ch = self._ch
        lock = self._lock
        ch.t_parked = _perf()
        ch.consumer_parked = True
        if ch.buf or ch.end:
            ch.consumer_parked = False
            return
        owner = ch.owner
        assert owner is not None
        try:
            while not lock.acquire(timeout=LIVENESS_INTERVAL):
                if ch.buf or ch.end:
                    break
                owner.check_alive()
        except BaseException:
            ch.consumer_parked = False
            self.close()
            raise
        # Re-arm: the lock is held while we are not parked.
        lock.acquire(blocking=False)

    def close(self) -> None:
        """Close the owner-side generator on the owner loop; wait (bounded) for cleanup."""
        ch = self._ch
        ch.delivered(self._taken)
        if not self._started or ch.end:
            ch.end = ch.end or _DONE
            return
        ch.stats.stream_closed()
        ch.request_close(None)
        deadline = _perf() + self._grace
        while not ch.end and _perf() < deadline:
            ch.consumer_parked = True
            if ch.end:
                break
            self._lock.acquire(timeout=LIVENESS_INTERVAL)
            if ch.owner is not None:
                ch.owner.check_alive()
        ch.consumer_parked = False
        ch.buf.clear()

    def __enter__(self) -> BlockingStream[Y]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self._started:
            self._ch.delivered(self._taken)
            if not self._ch.end:
                self._ch.request_close(None)
