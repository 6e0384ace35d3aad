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

Once the consumer is done with a stream (it saw the end, closed it, was
cancelled while waiting, or dropped it) the stream is *finished* for it, as a
native async generator is once closed or ended: the buffer is emptied and every
later ``__anext__`` raises ``StopAsyncIteration``, whatever the owner side's
outcome is or becomes.  A stream whose owner side ran to its end is counted
when its consumer is done, not when the owner finished: completed if the
consumer took every item, cancelled (and a consumer close, for ``aclose()`` /
``close()``) if it left items untaken.  Whichever of the two sides comes second
counts it (``Channel.end_latch``).

Flag protocol (no lock of ours): the side that parks sets its waiter, then
its ``parked`` flag, then re-checks the condition; the side that makes progress
changes the condition, then tests the flag.  One of the two always sees the other.
With the GIL, because its steps are ordered; on a free-threaded build, because
each side writes an attribute of the channel between its change and its test (the
consumer ``parked``, the pump ``produced`` after its append, the owner's settle
``outcome``, the consumer's ack ``acked``, the pump ``producer_parked``), and each
such write takes the channel's own lock: whichever side takes it second sees what
the other did before it.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Generic, TypeVar

from . import _interleave
from ._calls import cancel_message
from ._construction import NoPublicConstructor
from ._errors import Advice, Fix, LoopAffinityError, refuse, uses
from ._metrics import Counters
from ._operation import Operation, chain, check_block, check_queued
from ._outcome import CANCELLED, ERROR, OK, PENDING, REQUESTED
from ._ownership import on_owner_thread
from ._ports import Port, get_running_loop, running_port
from ._wakers import LoopWaker, ThreadWaker, TrioWaker, loop_waker, thread_waker

__all__ = ["RemoteStream", "BlockingStream", "Channel"]

Y = TypeVar("Y")
_perf = time.perf_counter

#: Where a stream's owner side counts an OK end: nowhere (the count is made
#: when the consumer is done with the stream; see Channel.count_end).
_NOT_COUNTED = itertools.count()
#: What the second of the two sides to be done with a stream pops off its latch.
_SECOND, _FIRST = "second", "first"


class Channel(Operation):
    """State shared by the pump (owner loop) and one consumer (any thread).

    ``parked`` (from :class:`~loopbridge._operation.Operation`) is the
    consumer's flag; ``producer_parked`` the pump's.
    """

    __slots__ = (
        "window",
        "ack_every",
        "buf",
        "acked",
        "taken",
        "producer_parked",
        "producer_waiter",
        "produced",
        "counted",
        "agen",
        "t_parked",
        "ahead",
        "unread_latch",
        "finished",
        "end_latch",
        "left",
    )

    kind = "stream"

    def __init__(self, *args: Any, ahead: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # nobody to wake until iteration starts
        # An OK end is counted once the consumer is done (count_end), not at settle.
        s = self.opts.metrics.streams
        self.counters = Counters(s.submitted, _NOT_COUNTED, s.outcome[ERROR], s.outcome[CANCELLED])
        window = self.opts.window
        if window < 1:
            raise ValueError(f"stream window must be at least 1, not {window}")
        self.window = window
        self.ack_every = max(1, window // 2)
        # None: batched, up to the window ahead (a generator that is the stream's
        # own); n: at most n items beyond what the consumer asked for.
        self.ahead: int | None = None
        self.unread_latch = [True]  # popped by whoever counts the unread items, once
        # The consumer is done with the stream: every later __anext__ ends it.
        self.finished = False
        # Popped once by the owner (settled) and once by the consumer (done).
        self.end_latch = [_SECOND, _FIRST]
        # How the consumer left (early, closing), written before it pops the latch.
        self.left = (False, False)
        if ahead is not None:
            self.set_ahead(ahead)
        self.buf: deque[Any] = deque()
        self.acked = 0  # items the consumer has taken, as last published
        self.taken = 0  # items the consumer has taken (consumer side)
        self.producer_parked = False
        self.producer_waiter: asyncio.Future[None] | None = None
        # Items the pump has put in the buffer (its own count, published per item:
        # see the flag protocol in the module).
        self.produced = 0
        # Metrics and hang dumps only: items already counted as delivered, the
        # generator, when the consumer last parked.
        self.counted = 0
        self.agen: Any = None
        self.t_parked = 0.0

    def set_ahead(self, ahead: int | None) -> None:
        """How far the pump may read ahead (before the stream starts)."""
        if ahead is not None:
            if ahead < 0:
                raise ValueError(f"read_ahead must be 0 or more items, or None, not {ahead}")
            self.ack_every = 1  # every item taken is published: the demand is exact
        else:
            self.ack_every = max(1, self.window // 2)
        self.ahead = ahead

    def count_unread(self) -> None:
        """Count the items read ahead that the consumer will never take (once)."""
        try:
            self.unread_latch.pop()  # atomic: under the list's lock on a free-threaded build
        except IndexError:
            return
        if self.buf:
            self.opts.metrics.stream_unread(len(self.buf))

    # -- hooks -----------------------------------------------------------------
    def on_settled(self) -> None:
        self.opts.metrics.stream_ended(self)
        if self.cancel is REQUESTED:  # the consumer left: nothing buffered is taken now
            self.count_unread()
        if self.end_latch.pop() is _SECOND:  # the consumer was done first
            self.count_end()
        if self.parked:
            self.parked = False
            self.waker.wake(self)

    def count_give_up(self) -> None:
        self.opts.metrics.stream_closed()

    def body(self, loop: asyncio.AbstractEventLoop) -> Coroutine[Any, Any, None]:
        if self.ahead is not None:
            return _pump_on_demand(self, loop)
        return _pump(self, loop)  # a frame once per stream, not per item

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "buffered": len(self.buf),
            "consumer_parked": self.parked,
            "producer_parked": self.producer_parked,
            "produced": self.produced,
        }

    # -- consumer side ---------------------------------------------------------
    def count_taken(self) -> None:
        """Count the items the consumer took since it last parked."""
        taken = self.taken
        n = taken - self.counted
        if n > 0:
            self.counted = taken
            self.opts.metrics.stream_batch(n)

    def take(self) -> Any:
        """The next buffered item (the buffer is not empty)."""
        self.taken = taken = self.taken + 1
        if taken - self.acked >= self.ack_every:
            self.ack(taken)
        return self.buf.popleft()

    def before_park(self) -> None:
        """The buffer was empty: raise the end if there is one, else return all credit.

        The buffer is looked at again *after* the outcome: the owner may have
        appended its last items and recorded the end since the consumer found
        the buffer empty.  It appends every item before it records the outcome,
        so once the outcome is seen, the buffer holds everything there is.
        """
        if _interleave.hook is not None:
            _interleave.hook("stream.buffer_empty")
        self.count_taken()
        if self.finished:  # closed or ended for its consumer already
            raise StopAsyncIteration
        if self.outcome is not PENDING and not self.buf:
            self.raise_end()
        # On demand, parking asks for one more item; batched, it returns all credit.
        self.ack(self.taken if self.ahead is None else self.taken + 1)

    def ack(self, taken: int) -> None:
        """Publish consumption; wake the producer if it waits for credit."""
        # One attribute store (a whole int: readers see old or new), then the flag
        # test; the pump writes producer_parked, then reads acked: both under the
        # channel's lock on a free-threaded build (see the module).
        self.acked = taken
        if self.producer_parked:
            self.producer_parked = False
            owner = self.owner
            if owner is not None:
                try:
                    owner.post(_wake_producer, self)
                except BaseException:  # the owner is gone: die() ends the stream
                    pass

    def close_needed(self, started: bool) -> bool:
        """A consumer closes: whether the owner side still runs and must be closed.

        A stream closed before its first item was asked for is marked ended
        here (nothing ran, so nothing is counted).
        """
        self.count_taken()
        if started and self.outcome is PENDING:
            return True
        if self.outcome is PENDING:
            self.outcome = OK
        return False

    def raise_end(self) -> None:
        """The consumer reached the end: StopAsyncIteration, or the owner side's
        error, once; StopAsyncIteration from then on."""
        if self.finished:
            raise StopAsyncIteration
        self.consumer_done(closing=False)
        if self.outcome is OK:
            raise StopAsyncIteration
        self.raise_outcome()

    def consumer_done(self, closing: bool) -> None:
        """The consumer is done with the stream (it saw the end, closed or dropped
        it, or was cancelled while waiting); the first time only.

        Nothing buffered is handed out from now on.  ``closing``: it closed the
        stream itself (``aclose()``, ``close()``) and no consumer close was counted
        for it yet.
        """
        if self.finished:
            return
        self.finished = True
        self.count_taken()
        # Early: before the owner side ended (it may end OK yet, racing the
        # close), or with items it never took.
        self.left = (self.outcome is PENDING or bool(self.buf), closing)
        if self.end_latch.pop() is _SECOND:  # the owner side was done first
            self.count_end()

    def count_end(self) -> None:
        """Count an owner side that ended OK, once both sides are done: completed,
        or, if the consumer left early, cancelled (and, if it closed the stream
        itself, a consumer close)."""
        if self.outcome is not OK or self.owner is None:  # counted at settle, or never ran
            return
        streams = self.opts.metrics.streams
        early, closing = self.left
        if not early:
            next(streams.outcome[OK])
            return
        if closing:
            self.count_give_up()
        next(streams.outcome[CANCELLED])

    def park_begins(self) -> bool:
        """Raise the consumer's flag; False when there is no need to wait after all."""
        self.t_parked = _perf()
        # Under the channel's lock on a free-threaded build, as the pump's store of
        # ``produced`` after its append and settle's of ``outcome``: see the module.
        self.parked = True
        if self.buf or self.outcome is not PENDING:
            self.parked = False
            return False
        return True


# ------------------------------------------------------------- owner side
async def _pump(ch: Channel, loop: asyncio.AbstractEventLoop) -> None:
    """Batched: read up to the window ahead of what the consumer took."""
    agen = ch.agen = ch.fn(*ch.args, **ch.kwargs)
    buf = ch.buf
    window = ch.window
    produced = 0
    try:
        async for item in agen:
            buf.append(item)
            # Published on the channel between the append and the flag test: on a
            # free-threaded build this store takes the channel's lock, which the
            # consumer's write of ``parked`` takes too (the flag protocol).
            ch.produced = produced = produced + 1
            if ch.parked:
                ch.parked = False
                ch.waker.wake(ch)
            if ch.cancel is REQUESTED:
                break
            if produced - ch.acked >= window:
                waiter = ch.producer_waiter = loop.create_future()
                ch.producer_parked = True
                if produced - ch.acked >= window:
                    await waiter
                ch.producer_parked = False
                ch.producer_waiter = None
                if ch.cancel is REQUESTED:
                    break
    except BaseException as exc:
        if await _pump_raised(ch, agen, exc, loop):
            raise
    else:
        await _pump_ended(ch, agen)


async def _pump_on_demand(ch: Channel, loop: asyncio.AbstractEventLoop) -> None:
    """On demand: ask the source for an item only when the consumer has asked for
    it (plus ``ahead``), so a consumer that leaves early leaves the rest unread in
    a source the stream does not own (a socket, a shared queue)."""
    agen = ch.agen = ch.fn(*ch.args, **ch.kwargs)
    buf = ch.buf
    ahead = ch.ahead or 0
    produced = 0
    try:
        while ch.cancel is not REQUESTED:
            if produced >= ch.acked + ahead:  # nothing asked for: wait for demand
                waiter = ch.producer_waiter = loop.create_future()
                ch.producer_parked = True
                if produced >= ch.acked + ahead and ch.cancel is not REQUESTED:
                    await waiter
                ch.producer_parked = False
                ch.producer_waiter = None
                continue
            try:
                item = await agen.__anext__()
            except StopAsyncIteration:
                break
            buf.append(item)
            # Published on the channel between the append and the flag test: on a
            # free-threaded build this store takes the channel's lock, which the
            # consumer's write of ``parked`` takes too (the flag protocol).
            ch.produced = produced = produced + 1
            if ch.parked:
                ch.parked = False
                ch.waker.wake(ch)
    except BaseException as exc:
        if await _pump_raised(ch, agen, exc, loop):
            raise
    else:
        await _pump_ended(ch, agen)


async def _pump_raised(
    ch: Channel, agen: Any, exc: BaseException, loop: asyncio.AbstractEventLoop
) -> bool:
    """The pump raised (a cancel, the generator's error): whether to re-raise."""
    if isinstance(exc, asyncio.CancelledError):
        await _aclose_quietly(agen)  # close it here, on the owner loop
    return ch.raised_on_owner(exc, loop)


async def _pump_ended(ch: Channel, agen: Any) -> None:
    """Ended normally or by a close request between items: close the generator
    here, on the owner loop, so its finally runs here."""
    try:
        await agen.aclose()
    except BaseException as exc:
        ch.settle(ERROR, exc)
        if not isinstance(exc, Exception):
            raise
        return
    if ch.cancel is REQUESTED:
        ch.settle(CANCELLED, asyncio.CancelledError(ch.cancel_msg))
    else:
        ch.settle(OK, None)


async def _aclose_quietly(agen: Any) -> None:
    try:
        await agen.aclose()
    except BaseException:  # the generator's own error on close; the cancel wins
        pass


def _wake_producer(ch: Channel) -> None:
    waiter = ch.producer_waiter
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


# ---------------------------------------------------------- asyncio/trio consumer
class RemoteStream(Generic[Y]):
    """What an async generator member returns through a proxy, off the owner loop.

    Behaves like an async generator object: ``async for``, ``__anext__``,
    ``asend(None)``, ``athrow`` and ``aclose``.  The owner-side generator starts
    when the first item is requested.
    """

    __slots__ = ("_ch", "_waker", "__weakref__")

    def __init__(self, ch: Channel) -> None:
        self._ch = ch
        # How this consumer waits: chosen by where the first item is asked for.
        # (It must not reference this object: `break` out of `async for` relies
        # on refcounting to run __del__ promptly.)
        self._waker: LoopWaker | TrioWaker | None = None

    def __repr__(self) -> str:
        return f"<loopbridge stream {self._ch.description}>"

    def __aiter__(self) -> RemoteStream[Y]:
        return self

    def _begin(self) -> LoopWaker | TrioWaker:
        ch = self._ch
        loop = get_running_loop()
        waker: LoopWaker | TrioWaker
        if loop is not None:
            waker = loop_waker(loop)
        else:
            from ._trio import in_trio_run, trio_port
            from ._wakers import trio_waker

            if not in_trio_run():
                raise refuse(
                    Advice(
                        f"iterating {ch.description} needs a running asyncio loop or trio",
                        [Fix("thread", uses(ch.description)[1], target="p")],
                        "p is the proxy; its blocking face iterates on this thread.",
                    )
                )
            waker = trio_waker(trio_port())
        self._waker = ch.waker = waker
        ch.submit()
        return waker

    async def __anext__(self) -> Y:
        ch = self._ch
        buf = ch.buf
        if buf:  # fast path: no await, no wake-up, no frame: Channel.take's body
            # (tests/core/test_one_definition.py compares the two)
            ch.taken = taken = ch.taken + 1
            if taken - ch.acked >= ch.ack_every:
                ch.ack(taken)
            return ch.buf.popleft()  # type: ignore[no-any-return]
        waker = self._waker
        if waker is None:
            if ch.outcome is not PENDING:  # closed before it started
                ch.raise_end()
            waker = self._begin()
        while not buf:
            ch.before_park()
            ch.waiter = waker.new_waiter()
            if ch.park_begins():
                try:
                    await waker.park(ch)
                except waker.cancelled as exc:
                    waker.unpark(ch)
                    ch.parked = False
                    await self._close_and_wait(waker, cancel_message(exc))
                    raise
                waker.unpark(ch)
        return ch.take()  # type: ignore[no-any-return]

    async def _close_and_wait(self, waker: LoopWaker | TrioWaker, msg: str | None) -> None:
        """Close the owner-side generator; wait (bounded) for its cleanup."""
        ch = self._ch
        ch.count_taken()
        gave_up = ch.caller_gives_up(msg)
        try:
            if gave_up:
                await waker.wait_settled(ch, ch.opts.grace)
        finally:
            _finish(ch, closing=not gave_up)

    async def aclose(self) -> None:
        """Close the owner-side generator on the owner loop and wait for its cleanup.

        From then on the stream is finished, as a closed native generator is:
        ``__anext__`` raises ``StopAsyncIteration``, whatever was buffered."""
        ch = self._ch
        if ch.finished:
            return
        waker = self._waker
        if ch.close_needed(waker is not None) and waker is not None:
            await self._close_and_wait(waker, None)
        else:  # ended already (or never started): what it read ahead stays unread
            _finish(ch, closing=True)

    async def asend(self, value: None) -> Y:
        if value is not None:
            raise TypeError("a loopbridge stream only accepts asend(None): items are prefetched")
        return await self.__anext__()

    async def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> Y:
        """Close the owner-side generator (as :meth:`aclose`) and raise the exception
        here; on a stream that is finished already, return None, as a finished
        native generator's ``athrow`` does."""
        if self._ch.finished:
            return None  # type: ignore[return-value]
        await self.aclose()
        exc = (
            typ
            if isinstance(typ, BaseException)
            else (typ(val) if val is None or not isinstance(val, BaseException) else val)
        )
        raise exc

    def __del__(self, _exiting: Callable[[], bool] = sys.is_finalizing) -> None:
        # Dropped without being exhausted or closed (e.g. `break` out of
        # `async for`): close the generator on its owner, without waiting.  Not at
        # interpreter exit, where this module's globals may already be None.
        if self._waker is not None and not _exiting():
            _drop(self._ch)


# ------------------------------------------------------------- thread consumer
class BlockingStream(Generic[Y], metaclass=NoPublicConstructor):
    """A blocking iterator over an owner-side async generator, for plain threads."""

    __slots__ = ("_ch", "_waker", "_timeout", "__weakref__")
    _lb_factory = "an async generator method of a loopbridge.blocking() face"

    def __init__(self, ch: Channel, timeout: float | None = None) -> None:
        self._ch = ch
        self._waker: ThreadWaker | None = None  # set when iteration starts
        self._timeout = timeout  # per item: the blocking face's

    def __iter__(self) -> Iterator[Y]:
        return self

    def _begin(self, here: Port | None) -> ThreadWaker:
        ch = self._ch
        if on_owner_thread(ch.opts.ownership):
            raise refuse(
                Advice(
                    f"blocking iteration of {ch.description} on the owner loop's own thread "
                    "would deadlock",
                    [Fix("owner", uses(ch.description)[0], target="p", say="use async for on")],
                    "A blocking iteration waits for the loop this thread runs.",
                )
            )
        if here is not None:  # before anything runs on the owner
            self._refuse_cycle(ch, ch.opts.ownership.port(), here)
            ch.ctx.run(chain.set, (*chain.get(), ch))  # its work is part of the waits
        waker = self._waker = thread_waker()
        ch.waker = waker
        ch.submit()
        return waker

    def __next__(self) -> Y:
        ch = self._ch
        if not ch.buf:  # else served from delivered items: no wait, no check
            self._wait(ch)
        return ch.take()  # type: ignore[no-any-return]

    def _wait(self, ch: Channel) -> None:
        """The buffer is empty: wait for an item (or raise the stream's end).

        On an event loop's thread the wait blocks that loop too, so it is checked
        like a blocking call (see ``check_block`` in :mod:`loopbridge._operation`):
        while it lasts, the loop's port records the stream as what its thread is
        blocked on, and the stream's work carries the stream in its context.
        """
        loop = get_running_loop()
        here = None if loop is None else running_port(loop)
        if here is None:  # a plain thread: blocking it blocks no loop
            self._until_item(ch, None)
            return
        held, here.blocked = here.blocked, ch  # its wakes are sent at once from now on
        here.flush_deferred()
        try:
            self._until_item(ch, here)
        finally:
            here.blocked = held

    def _until_item(self, ch: Channel, here: Port | None) -> None:
        waker = self._waker
        if waker is None:
            if ch.outcome is not PENDING:
                raise StopIteration
            waker = self._begin(here)
            fresh = True  # the first wait: nothing of its work ran yet
        else:
            fresh = False
        while not ch.buf:
            try:
                ch.before_park()
            except StopAsyncIteration:
                raise StopIteration from None
            ch.waiter = waker.new_waiter()
            if here is not None and not fresh:
                self._refuse_cycle(ch, ch.owner, here)
            fresh = False
            if ch.park_begins():
                try:
                    waker.park(ch, self._timeout)
                except BaseException:
                    ch.parked = False
                    self.close()
                    raise

    def _refuse_cycle(self, ch: Channel, owner: Port | None, here: Port) -> None:
        """Refuse a wait that closes a cycle of blocked owner threads, and close the
        stream without waiting for its owner side (that wait could not end either:
        the owner side finishes once this loop runs again)."""
        try:
            if owner is not None:
                check_block(ch, owner, here)
            if self._waker is not None:
                check_queued(ch, here)
        except LoopAffinityError:
            ch.count_taken()
            needed = ch.close_needed(self._waker is not None)
            gave_up = needed and ch.caller_gives_up(None)
            _finish(ch, closing=not gave_up)  # without waiting: see above
            raise

    def close(self) -> None:
        """Close the owner-side generator on the owner loop; wait (bounded) for cleanup."""
        ch = self._ch
        if ch.finished:
            return
        waker = self._waker
        if not ch.close_needed(waker is not None) or waker is None:
            _finish(ch, closing=True)  # ended already (or never started)
            return
        gave_up = ch.caller_gives_up(None)
        try:
            if gave_up:
                waker.wait_settled(ch, ch.opts.grace)
        finally:
            _finish(ch, closing=not gave_up)

    def __enter__(self) -> BlockingStream[Y]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self, _exiting: Callable[[], bool] = sys.is_finalizing) -> None:
        if self._waker is not None and not _exiting():  # see RemoteStream.__del__
            _drop(self._ch)


def _finish(ch: Channel, closing: bool) -> None:
    """The consumer closed the stream (and waited, if it had to): what is still
    buffered is never handed out."""
    ch.count_unread()
    ch.consumer_done(closing)
    ch.buf.clear()


def _drop(ch: Channel) -> None:
    """The consumer dropped a started stream: close its owner side, without waiting."""
    if ch.finished:
        return
    ch.count_taken()
    if not ch.request_cancel(None):
        ch.count_unread()  # ended already (else the owner counts when it stops)
    ch.consumer_done(closing=False)
