"""What a call and a stream share: one operation in flight towards an owner loop.

Life of an operation::

    caller: submit() ......... registered with the owner's port, start posted
    owner:  start_on_owner() . follows a transfer, honours an early cancel,
                               else starts the owner-side task
    any:    settle() ......... records the outcome once, wakes the caller

Invariants:

* ``outcome`` leaves :attr:`Outcome.PENDING` exactly once; the first writer
  wins (the owner task, a cancel, and owner death may race from different
  threads).  The latch is leaving the owner port's in-flight set
  (:meth:`Port.leave`, one atomic ``dict.pop``): only the thread that took the
  operation out records an outcome, so an outcome is never paired with another
  writer's value nor counted twice.
* the caller is woken after the outcome is recorded, from whichever thread
  recorded it; see :mod:`loopbridge._ports` for why a wake, once posted, is
  never lost even if the loop that posted it stops at once.
* ``cancel`` is :attr:`Cancel.REQUESTED` only when the *caller* asked (before
  it posts the cancel).  The owner side reads it to tell a caller's cancel
  (the caller already knows) from one made on the owner side, which reaches
  the caller as a cancel, or as :class:`~loopbridge.OwnerLoopClosed` when the
  owner loop is shutting down.
* every operation is in its owner port's ``inflight`` set from submission to
  settlement (or to its move to a new owner after a transfer), so owner death
  fails it instead of leaving it waiting.
* an operation the owner has not started is never started once its caller
  gave up on it (the *withdrawal handshake*, no lock of ours): the caller
  writes ``cancel`` (``REQUESTED``) and then reads ``t_start``; the owner's
  :func:`start_on_owner` writes ``t_start`` and then reads ``cancel``.  One of
  the two always sees the other's write: a caller that reads ``t_start`` as
  0.0 has taken the operation back (the owner will read ``REQUESTED`` and not
  start it), and one that reads it set waits for the owner side's cancel.
  With the GIL the steps are ordered; on a free-threaded build both fields are
  the operation's own attributes, and each write takes the operation's lock:
  the side that takes it second sees the other's write.  The same holds for
  every flag protocol on one operation (``outcome`` against ``parked`` and
  ``waker``: see :mod:`loopbridge._wakers`).
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from . import _interleave
from ._compat import TASK_FACTORY_ATTR
from ._diagnose import SubmissionSites, submission_site
from ._eager import NATIVE_EAGER, start_task, step_then_task
from ._errors import Advice, Fix, LoopAffinityError, OwnerLoopClosed, owner_closed, refuse, uses
from ._labels import thread_name
from ._outcome import CANCELLED, ERROR, NOT_REQUESTED, OK, PENDING, REQUESTED, Outcome
from ._ports import ABSENT, Port, get_running_loop

if TYPE_CHECKING:
    from ._metrics import Counters, Metrics
    from ._ownership import Ownership

__all__ = [
    "Waker",
    "Options",
    "Operation",
    "NOT_WAITING",
    "start_on_owner",
    "cancel_on_owner",
    "owner_cancelled",
    "annotate",
    "chain",
    "check_block",
    "check_queued",
    "check_submission",
]

_perf = time.perf_counter
_PY311 = sys.version_info >= (3, 11)
_NOT_STOCK = object()  # a loop with no such attribute (uvloop, others)


class Options:
    """A proxy's settings, shared by every call and stream made through it."""

    __slots__ = ("ownership", "metrics", "window", "grace", "eager", "shape")

    def __init__(
        self,
        ownership: Ownership,
        window: int,
        grace: float,
        eager: bool,
        shape: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self.ownership = ownership
        self.metrics: Metrics = ownership.metrics
        self.window = window
        self.grace = grace
        self.eager = eager
        # How the owner hands back a call's non-plain result (the proxy layer's
        # rules for returned objects); None: as it is.
        self.shape = shape


def annotate(exc: BaseException, description: str, owner: Port) -> None:
    """Add a note naming the owner loop and the operation (once per exception)."""
    note = f"loopbridge: raised by {description} on its owner loop ({owner.label})"
    notes = getattr(exc, "__notes__", None)
    if notes is not None and note in notes:
        return
    if _PY311:
        exc.add_note(note)
    else:  # pragma: no cover - 3.10
        exc.__notes__ = [*(notes or ()), note]  # type: ignore[attr-defined, unused-ignore]


class Waker(Protocol):
    """How a caller waits for an operation (the kinds are in ``_wakers``)."""

    @property
    def label(self) -> str: ...

    @property
    def thread_id(self) -> int | None: ...

    #: The caller's context names another async library to sniffio (a trio
    #: caller's does): the owner's copy leaves that out.
    foreign_context: bool

    def wake(self, op: Operation) -> None:
        """Wake the caller parked on ``op`` (any thread; harmless when repeated)."""


class NotWaiting:
    """The waker of an operation nobody waits on yet (a stream not iterated yet)."""

    __slots__ = ()

    label = "nobody yet"
    thread_id = None
    foreign_context = False

    def wake(self, op: Operation) -> None:
        pass


NOT_WAITING = NotWaiting()


class Operation:
    """A call or stream in flight; subclasses say what runs and how it is counted."""

    __slots__ = (
        "fn",
        "args",
        "kwargs",
        "ctx",
        "description",
        "opts",
        "counters",
        "owner",
        "outcome",
        "value",
        "cancel",
        "cancel_msg",
        "task",
        "waker",
        "waiter",  # what the caller parks on (a future, trio event or lock), set by arm()
        "parked",
        "t_submit",
        "t_start",
        "t_end",
        "site",
        # Set only once a caller gives up (never on the hot path): when it last
        # probed the owner loop, and when the owner loop last answered (see
        # _wakers.wait_settled).
        "probed",
        "answered",
        "__weakref__",
    )

    kind = "operation"
    waiter: Any
    probed: float  # set once a caller gives up (see __slots__)
    answered: float
    #: ``Options.eager`` runs the body's first step with no task where the
    #: runtime can't start tasks eagerly (before 3.12); calls only, see _eager.
    steps_without_task = False
    #: The caller waits for the outcome whatever happens (a call), so settling
    #: wakes it; otherwise settling calls :meth:`on_settled`.
    always_woken = False

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        description: str,
        opts: Options,
        waker: Waker = NOT_WAITING,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.ctx = contextvars.copy_context()
        self.description = description
        self.opts = opts
        self.counters: Counters = opts.metrics.calls  # a stream says streams
        self.owner: Port | None = None
        self.outcome = PENDING
        self.value: Any = None
        self.cancel = NOT_REQUESTED
        self.cancel_msg: str | None = None
        self.task: asyncio.Task[Any] | None = None
        self.waker = waker
        self.parked = False
        self.t_submit = _perf()
        self.t_start = 0.0
        self.t_end = 0.0
        self.site = submission_site() if SubmissionSites.recording else None

    # -- hooks -----------------------------------------------------------------
    def on_settled(self) -> None:
        """Wake the caller if it needs waking (any thread); unless ``always_woken``."""
        raise NotImplementedError

    def body(self, loop: asyncio.AbstractEventLoop) -> Coroutine[Any, Any, None]:
        """The owner-side work, as the coroutine its task runs (owner thread).

        It records the outcome itself.  An ``async def`` in a subclass: calling
        it only makes the coroutine, so starting costs no frame of ours.
        """
        raise NotImplementedError

    # -- caller side -----------------------------------------------------------
    def submit(self, rerouted: bool = False) -> None:
        """Register with the owner's port and post the start (caller thread).

        ``rerouted``: the old owner is moving it to the new one after a transfer
        (on the old owner's thread).  It was counted when first submitted, and
        the re-route records a failure here as its outcome.
        """
        counters = self.counters
        if not rerouted:
            next(counters.submitted)
        ownership = self.opts.ownership
        owner = ownership._port
        try:
            if owner is None or owner.dead is not None:
                try:
                    owner = ownership.port()
                except OwnerLoopClosed as exc:  # name this operation, not only the loop
                    raise owner_closed(self.description, exc, starting=True) from None
            if owner.blocked is not None:  # its loop's thread waits in a blocking call
                check_submission(self, owner)
            self.owner = owner
            owner.submit(self, start_on_owner)
        except BaseException:
            if not rerouted:
                next(counters.outcome[ERROR])
            raise

    def caller_gives_up(self, msg: str | None) -> bool:
        """The caller stops waiting (its cancel or timeout, a stream's close): the one
        caller-side cancel path.  Counts it once; takes the operation back if the
        owner has not started it (it is then settled ``CANCELLED`` and never
        starts), else asks the owner side to cancel.  True when the caller should
        now wait for that cleanup (``wait_settled``: bounded by ``cancel_grace``,
        and by the owner loop answering at all)."""
        if self.outcome is not PENDING:
            return False
        self.count_give_up()
        if self.owner is None:
            return False  # never submitted: nothing runs anywhere
        asked = self.cancel is REQUESTED  # by a dropped stream, say: posted already
        self.cancel_msg = msg
        # Written before t_start is read: the withdrawal handshake (the op's lock on a
        # free-threaded build, taken by start_on_owner's t_start write too).
        self.cancel = REQUESTED
        if _interleave.hook is not None:
            _interleave.hook("give_up.cancel_written")
        if not self.t_start:
            # start_on_owner writes t_start before it reads cancel, so it will
            # see REQUESTED and not start: take the call back now.  The latch
            # may be someone else's (owner death; a transfer moving it between
            # ports, whose new owner then settles it CANCELLED).
            self.settle(CANCELLED, asyncio.CancelledError(msg))
            return False
        if not asked:
            self._post_cancel(self.owner)
        return True

    def count_give_up(self) -> None:
        """Count a caller's cancel (a call) or close (a stream)."""
        raise NotImplementedError

    def request_cancel(self, msg: str | None) -> bool:
        """Ask the owner side to cancel (any thread, never blocks).

        Returns False when there is nothing to cancel: settled already, asked
        already, or never submitted.
        """
        owner = self.owner
        if self.outcome is not PENDING or self.cancel is REQUESTED or owner is None:
            return False
        self.cancel_msg = msg
        self.cancel = REQUESTED
        return self._post_cancel(owner)

    def _post_cancel(self, owner: Port) -> bool:
        try:
            owner.post(cancel_on_owner, self)
        except BaseException:  # the owner is gone: die() settles this operation
            return False
        return True

    # -- any thread ------------------------------------------------------------
    def settle(self, outcome: Outcome, value: Any, latched: bool = False) -> None:
        """Record the outcome and wake the caller, if no one has settled it yet.

        ``latched``: the caller already won the settle latch (``Port.leave``),
        as owner death and a failed re-route do.
        """
        if not latched:
            owner = self.owner
            if owner is None:
                return
            # Port.leave's statements, to save its frame once per operation
            # (tests/core/test_one_definition.py compares the two): one dict.pop,
            # atomic under the dict's own lock on a free-threaded build.
            if owner.inflight.pop(self, ABSENT) is ABSENT:
                return
            if _interleave.hook is not None:
                _interleave.hook("settle.latched")
        self.value = value
        self.t_end = _perf()
        # Last: readers on other threads test it first.  On a free-threaded build
        # the store publishes with release order (and under the op's lock): a
        # reader that sees it sees the value, and the flags read below come after.
        self.outcome = outcome
        next(self.counters.outcome[outcome])
        if self.always_woken:  # a call: an attribute test, not a frame per call
            self.waker.wake(self)
        else:
            self.on_settled()

    def owner_died(self, exc: BaseException) -> None:
        """The owner's port took this operation out of its in-flight set: fail it."""
        self.settle(ERROR, exc, latched=True)

    def raise_outcome(self) -> Any:
        """Return the value or raise the owner's exception (caller side)."""
        outcome = self.outcome
        if outcome is OK:
            return self.value
        exc = self.value
        if outcome is CANCELLED:
            raise asyncio.CancelledError(*exc.args)
        owner = self.owner
        if owner is not None:  # always, once settled: only a submitted operation settles
            annotate(exc, self.description, owner)
        raise exc

    def describe(self) -> dict[str, Any]:
        now = _perf()
        owner = self.owner
        return {
            "kind": self.kind,
            "what": self.description,
            "caller": self.waker.label,
            "owner": owner.label if owner else None,
            "submitted_from_thread": thread_name(self.waker.thread_id),
            "waiting_s": round(now - self.t_submit, 6),
            "running_s": round(now - self.t_start, 6) if self.t_start else None,
            "started": bool(self.t_start),
            "cancel_requested": self.cancel is REQUESTED,
            "outcome": self.outcome.value,
        }

    # -- owner side ------------------------------------------------------------
    def raised_on_owner(self, exc: BaseException, loop: asyncio.AbstractEventLoop) -> bool:
        """The owner-side work raised ``exc`` (owner thread).  Returns whether
        it must propagate out of the task (a cancel, an interrupt)."""
        if isinstance(exc, asyncio.CancelledError):
            if self.cancel is REQUESTED:
                self.settle(CANCELLED, exc)
            else:
                # Someone on the owner side cancelled, or the loop is shutting
                # down.  Decide one iteration later, when the port's keeper has
                # seen a shutdown sweep if there is one.
                loop.call_soon(owner_cancelled, self, exc)
            return True
        self.settle(ERROR, exc)
        return isinstance(exc, (KeyboardInterrupt, SystemExit))


def start_on_owner(op: Operation) -> None:
    """Runs on the owner loop, from the port's drain."""
    owner = op.owner
    assert owner is not None
    if op.outcome is not PENDING:
        return
    loop: asyncio.AbstractEventLoop = owner.loop
    if op.opts.ownership.owner.loop is not loop:
        _follow(op, owner)  # ownership moved after this operation was submitted
        return
    # The withdrawal handshake (see the module): t_start written, then cancel
    # read; a caller that gave up before this read has taken the call back.
    op.t_start = _perf()  # under the op's lock on a free-threaded build: see the module
    if op.cancel is REQUESTED:
        op.t_start = 0.0  # it never started: no admission latency is recorded
        op.settle(CANCELLED, asyncio.CancelledError(op.cancel_msg))
        return
    if op.waker.foreign_context:  # an attribute test: most callers are not trio
        _forget_caller_library(op.ctx)
    try:
        if op.steps_without_task and op.opts.eager:
            # The first step runs now, in this drain: nothing runs between the
            # check above and the member's start.
            op.task = step_then_task(loop, op.body(loop), op.ctx)  # None: finished
        elif (
            # The common case inline (one C-level getattr, no Python call): a stock
            # loop with no task factory on 3.12+; _starts_eagerly decides the rest.
            NATIVE_EAGER and getattr(loop, TASK_FACTORY_ATTR, _NOT_STOCK) is None
        ) or _starts_eagerly(loop):
            op.task = start_task(loop, op.body(loop), op.ctx)
        else:
            # The task's first step comes later: a transfer() may return before
            # it, so the owner is checked again there (see _when_started).
            op.task = start_task(loop, _when_started(op, owner, loop), op.ctx)
    except BaseException as exc:
        # Nothing will run it (a task factory that raised, say): fail it now,
        # or its caller would wait forever.
        op.settle(ERROR, exc)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise


def _follow(op: Operation, owner: Port) -> None:
    """``op`` reached ``owner``, which no longer owns its object: re-route it to
    the new owner, unless someone settled it meanwhile (then leave() is False)."""
    if owner.leave(op):
        op.task = None  # a task here never ran it: a cancel goes to the new owner's
        # A first step here runs inside op.ctx; the new owner's thread may enter
        # it before this step ends, and a context is entered by one thread at once.
        op.ctx = op.ctx.copy()
        try:
            op.submit(rerouted=True)
        except BaseException as exc:  # registered nowhere now: record here
            op.settle(ERROR, exc, latched=True)


def _starts_eagerly(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether :func:`start_task` runs the first step at once on ``loop``: 3.12+
    with no task factory (a factory may defer it, as create_task does)."""
    if not NATIVE_EAGER:
        return False
    factory = getattr(loop, TASK_FACTORY_ATTR, _NOT_STOCK)
    if factory is _NOT_STOCK:  # uvloop starts eagerly without one; others, unknown
        return type(loop).__module__ == "uvloop" and loop.get_task_factory() is None
    return factory is None


async def _when_started(op: Operation, owner: Port, loop: asyncio.AbstractEventLoop) -> None:
    """The first step of a task that did not start at once: the owner is checked
    again here, on the owner's thread, right before the member runs, so a call
    never starts on a loop that gave the object away before this step."""
    if _interleave.hook is not None:
        _interleave.hook("start.first_step")
    if op.opts.ownership.owner.loop is not loop:
        _follow(op, owner)
        return
    await op.body(loop)


def _forget_caller_library(ctx: contextvars.Context) -> None:
    """The owner runs asyncio, whatever the caller runs.

    The caller's context crosses (request ids, tracing), but a trio caller's
    context also says "trio" to sniffio, and libraries that pick their I/O
    backend with sniffio (httpx through httpcore, anyio) would then use trio's
    primitives on the owner's asyncio loop.  So that one variable is cleared in
    the owner's copy, and sniffio looks at the running loop instead.
    """
    var = getattr(sys.modules.get("sniffio"), "current_async_library_cvar", None)
    if isinstance(var, contextvars.ContextVar) and ctx.get(var) is not None:
        ctx.run(var.set, None)


def cancel_on_owner(op: Operation) -> None:
    """The caller asked for a cancel (owner thread)."""
    owner = op.owner
    if owner is not None and get_running_loop() is not owner.loop:
        # Posted to the old owner of an operation that a transfer moved on:
        # cancel it where it runs now, from that loop's own thread.
        owner.post(cancel_on_owner, op)
        return
    msg = op.cancel_msg
    task = op.task
    if task is None:
        # Not started (start_on_owner will see the request), or finished
        # without a task: either way the cancel is the outcome if none is yet.
        op.settle(CANCELLED, asyncio.CancelledError(msg))
    elif not task.done():
        task.cancel(msg)
        # A task cancelled before its first step never runs its own handlers.
        task.add_done_callback(lambda _: op.settle(CANCELLED, asyncio.CancelledError(msg)))


def owner_cancelled(op: Operation, exc: asyncio.CancelledError) -> None:
    """One iteration after an owner-side cancel: shutdown, or a plain cancel?"""
    owner = op.owner
    if owner is not None and owner.die_if_shutting_down():
        return  # die() failed the operation with OwnerLoopClosed
    op.settle(CANCELLED, exc)


# ------------------------------------------------- cycles of blocked threads
# Blocking waits that can never end: cycles of blocked owner threads.
#
# ``blocking(p).m()`` blocks the calling thread.  Called on the thread of an
# event loop B (sync code inside a coroutine on B), it blocks B too.  The wait can
# then never end when what it waits for needs B:
#
# * B's thread waits on a call to A while A's thread waits on a call to B (two
#   blocking calls across): a cycle of blocked threads, known when the second
#   one blocks;
# * B's thread waits on a call X to A, and X's work (X itself, or anything it
#   awaits, on any loop) submits a call to B: B's loop cannot run it until X
#   ends.
#
# A blocking stream's ``next()`` is such a wait too, each time it has to wait
# (not when it is served from items already delivered): the stream is recorded
# as what the thread is blocked on, and its work carries it in its context.
#
# Both are refused at once with :class:`~loopbridge.LoopAffinityError` naming the
# loops in the cycle, instead of hanging.  Each loop's port records the call its
# thread is blocked on (``Port.blocked``); each blocking call carries, in the
# context its work runs in, the chain of blocking calls it is part of
# (:data:`chain`), so a call submitted to a blocked loop is checked against the
# call that loop waits on.  The hot path pays one attribute test per submission
# (``Port.blocked`` is ``None`` unless that loop's thread is blocked).

#: The blocking calls the current work is part of, outermost first.
chain: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
    "loopbridge_blocking_chain", default=()
)

_MAX_HOPS = 64


def check_block(call: Any, owner: Port, here: Port) -> None:
    """Before ``here``'s loop thread blocks on ``call`` (owned by ``owner``): refuse
    a wait that closes a cycle of blocked owner threads."""
    path = [here, owner]
    port: Port | None = owner
    for _ in range(_MAX_HOPS):
        if port is here:
            raise _cycle(call.description, path)
        waited = port.blocked if port is not None else None
        if waited is None or waited.owner is None:
            return
        port = waited.owner
        path.append(port)


def check_queued(stream: Any, here: Port) -> None:
    """Before ``here``'s loop thread blocks on ``stream`` (a blocking stream's
    later wait): refuse it if the stream's work already submitted a call to
    ``here`` that is still in flight, which ``here``'s loop cannot run while its
    thread waits.  (A stream's work runs between waits too, so its calls to
    ``here`` can be in before the wait begins; those made during the wait are
    refused by :func:`check_submission`.)"""
    for op in list(here.inflight):  # a copy, made under the dict's lock: others add, remove
        if not isinstance(op, Operation) or op.outcome is not PENDING:
            continue
        made_by = op.ctx.get(chain, ())
        if any(c is stream for c in made_by):
            raise _cycle(
                f"{stream.description}, waiting for {op.description} that its work made",
                [here, *_hops(made_by, stream), here],
            )


def check_submission(op: Any, port: Port) -> None:
    """``op`` is submitted to ``port``, whose loop thread is blocked on a call: if
    ``op`` is part of that call's work, ``port`` can never run it."""
    blocked = port.blocked
    if blocked is None:
        return
    blocking = op.ctx.get(chain, ())
    if any(c is blocked for c in blocking):
        raise _cycle(
            f"{op.description}, made by the work of {blocked.description}",
            [port, *_hops(blocking, blocked), port],
        )


def _hops(made_by: tuple[Any, ...], first: Any) -> list[Port]:
    """The loops a chain of blocking calls waits on, from ``first`` on: the whole
    cycle, A -> B -> C, where only A and its first wait were known."""
    start = next(i for i, c in enumerate(made_by) if c is first)
    return [c.owner for c in made_by[start:] if c.owner is not None]


def _cycle(what: str, path: list[Port]) -> LoopAffinityError:
    loops = " -> ".join(p.label for p in path)
    # The fix is for the blocking call on path[0]'s thread (after "made by the
    # work of" when what names the call that work made).
    on_loop, from_thread = uses(what.rsplit(", made by the work of ", 1)[-1])
    return refuse(
        Advice(
            f"{what} would wait for ever, as the blocked owner threads form a cycle ({loops})",
            [
                Fix(
                    "loop", on_loop, target="p", say=f"on {path[0].label} await the proxy instead:"
                ),
                Fix(
                    "thread",
                    from_thread,
                    target="p",
                    say="make the blocking call from a plain thread:",
                ),
            ],
            f"A blocking call (loopbridge.blocking(...)) made on the thread of {path[0].label} "
            "blocks that loop, and the work it waits for needs it.",
        )
    )
