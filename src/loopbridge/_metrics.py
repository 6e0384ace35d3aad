"""Counters and latency histograms for calls and streams across loops.

Each loop-affine object has one :class:`Metrics` (shared by all its proxies).  The
hot path must stay far below the cost of a cross-thread hop (about 20 µs), so
recording is split:

* counters are ``itertools.count`` objects: ``next()`` is atomic under the GIL
  and a compare-and-swap on a free-threaded build, exact from any number of
  threads, and costs about 40 ns;
* latencies are appended as raw samples to a ``deque`` (an atomic append: under
  the deque's own lock on a free-threaded build) and folded into histogram
  buckets in batches, by whichever thread pushes the batch over its size, or by
  a reader; folds and reads hold ``_lock``, and a histogram is touched only
  under it (a lock off the hot path: taken once per batch or read).

Latencies are split where the time goes:

* *admission*: submitted on the caller until it starts on the owner loop; this
  grows when the owner loop is busy, which is what makes a served p99 grow;
* *run*: running on the owner loop;
* *return*: finished on the owner until the caller resumes.

Totals must only ever grow (Prometheus reads a drop as a process restart), so
when a loop-affine object is garbage collected its numbers are folded into a
per-name "retired" total instead of disappearing with it.

A collected object costs nothing for long, whether or not anyone reads the
metrics: its weak reference's callback only moves its numbers to a dead list
(it may run inside any allocation, even one made under a lock below), and the
next object made folds that list into the per-name totals once it holds
``_FOLD_DEAD_AT`` entries, as every reader does first.  So the dead list never
holds more than ``_FOLD_DEAD_AT`` entries plus the objects that died since the
last one was made, and memory is bounded by the names, not by how many objects
came and went or how often metrics are read.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from itertools import compress, repeat, starmap
from operator import sub as _sub
from typing import Any, Protocol

from ._compat import counter_value as _value
from ._construction import NoPublicConstructor
from ._histogram import Histogram, observe_all
from ._outcome import Outcome

__all__ = [
    "Metrics",
    "Counters",
    "Totals",
    "totals_by_name",
]

_OK, _ERROR = Outcome.OK, Outcome.ERROR

_FOLD_AT = 2048
#: Dead objects' numbers waiting to be folded into the per-name totals (at most
#: this many, plus those that died since the last object was made).
_FOLD_DEAD_AT = 64
#: Below this many samples a fold observes them one by one.
_FEW = 8
#: Guards every object's folds and reads (each rare, and short; the module's
#: global, read at each use, so that a fork can make it anew).
_lock = threading.RLock()

#: Counter names, in the order a reader must take them (see Totals.read).
_CALL_KEYS = (
    "ok", "errors", "cancelled", "caller_cancels", "submitted",
    "delivered_despite_cancel", "results_dropped",
)  # fmt: skip
_STREAM_KEYS = (
    "completed", "errors", "cancelled", "consumer_closes", "opened", "items", "wakeups", "unread",
)  # fmt: skip


class _Timed(Protocol):
    """What :class:`Metrics` reads of a finished call or stream: its
    ``perf_counter`` times (``t_start`` 0.0 if it never started on the owner)."""

    @property
    def t_submit(self) -> float: ...
    @property
    def t_start(self) -> float: ...
    @property
    def t_end(self) -> float: ...


class Totals:
    """Plain numbers read from one or more :class:`Metrics`; can be summed."""

    __slots__ = ("calls", "streams", "admission", "run", "returned", "batch_size")

    def __init__(self) -> None:
        self.calls = dict.fromkeys(_CALL_KEYS, 0)
        self.streams = dict.fromkeys(_STREAM_KEYS, 0)
        self.admission = Histogram()
        self.run = Histogram()
        self.returned = Histogram()
        self.batch_size = Histogram(items=True)

    def add(self, other: Totals) -> None:
        for k, v in other.calls.items():
            self.calls[k] += v
        for k, v in other.streams.items():
            self.streams[k] += v
        self.admission.merge(other.admission)
        self.run.merge(other.run)
        self.returned.merge(other.returned)
        self.batch_size.merge(other.batch_size)

    @property
    def calls_in_flight(self) -> int:
        c = self.calls
        return c["submitted"] - c["ok"] - c["errors"] - c["cancelled"]

    @property
    def streams_open(self) -> int:
        s = self.streams
        return s["opened"] - s["completed"] - s["errors"] - s["cancelled"]

    def as_dict(self) -> dict[str, Any]:
        """Flat field names; see ``docs/metrics.md``."""
        c, s = self.calls, self.streams
        calls_in_flight, streams_open = self.calls_in_flight, self.streams_open
        return {
            "calls": c["submitted"],
            "ok": c["ok"],
            "errors": c["errors"],
            "cancelled": c["cancelled"],
            "caller_cancels": c["caller_cancels"],
            "delivered_despite_cancel": c["delivered_despite_cancel"],
            "results_dropped": c["results_dropped"],
            "calls_in_flight": calls_in_flight,
            "streams": s["opened"],
            "streams_completed": s["completed"],
            "stream_errors": s["errors"],
            "streams_cancelled": s["cancelled"],
            "consumer_closes": s["consumer_closes"],
            "streams_open": streams_open,
            "in_flight": calls_in_flight + streams_open,
            "stream_items": s["items"],
            "stream_batches": s["wakeups"],
            "items_per_wakeup": s["items"] / s["wakeups"] if s["wakeups"] else None,
            "stream_items_unread": s["unread"],
            "admission": self.admission.as_dict(),
            "run": self.run.as_dict(),
            "return": self.returned.as_dict(),
            "batch_size": self.batch_size.as_dict(),
        }


def _fold_latencies(
    samples: deque[tuple[float, float, float, float]],
    admission: Histogram,
    run: Histogram,
    returned: Histogram,
) -> None:
    """Fold a batch of samples with C-level loops (``starmap``, ``zip``, ``map``,
    ``compress``, ``sort``).

    Per sample this costs under half of a Python loop over the samples
    (sorting and bisecting also beat computing each bucket with ``map``): it
    runs once per 2048 calls on the hot path, so per call it is the part of
    the metrics that matters.  A zero
    ``t_end`` (streams) or ``t_return`` (a call that did not return) means no
    run or return latency.
    """
    # Take what is there now; samples appended meanwhile stay for the next fold.
    batch = list(starmap(samples.popleft, repeat((), len(samples))))
    if not batch:
        return
    if len(batch) < _FEW:  # a retired object's handful: skip the bulk machinery
        for submitted, started, ended, resumed in batch:
            admission.observe(started - submitted)
            if ended:
                run.observe(ended - started)
                if resumed:
                    returned.observe(resumed - ended)
        return
    t_submit, t_start, t_end, t_return = zip(*batch)
    observe_all(admission, list(map(_sub, t_start, t_submit)))
    observe_all(run, list(compress(map(_sub, t_end, t_start), t_end)))
    observe_all(returned, list(compress(map(_sub, t_return, t_end), t_return)))


class _Hists:
    """The histograms of one object, made at its first fold (most objects that
    come and go never fold: their few samples are retired straight into totals)."""

    __slots__ = ("admission", "run", "returned", "batch_size")

    def __init__(self) -> None:
        self.admission = Histogram()
        self.run = Histogram()
        self.returned = Histogram()
        self.batch_size = Histogram(items=True)

    def merge_into(self, t: Totals) -> None:
        for mine, theirs in (
            (self.admission, t.admission),
            (self.run, t.run),
            (self.returned, t.returned),
            (self.batch_size, t.batch_size),
        ):
            if mine.n:
                theirs.merge(mine)


class _Data:
    """What one :class:`Metrics` records.  Holds no reference to the Metrics, so it
    can outlive it and be retired into the per-name totals."""

    __slots__ = (
        "c_ok", "c_errors", "c_cancelled", "c_caller_cancels", "c_submitted",
        "c_delivered", "c_dropped",
        "s_completed", "s_errors", "s_cancelled", "s_closes", "s_opened",
        "samples", "sizes", "items", "unread", "hists",
    )  # fmt: skip

    def __init__(self) -> None:
        count = itertools.count
        self.c_ok, self.c_errors, self.c_cancelled = count(), count(), count()
        self.c_caller_cancels, self.c_submitted = count(), count()
        # Cold: a result that raced its caller's cancel (see _calls' contract).
        self.c_delivered, self.c_dropped = count(), count()
        self.s_completed, self.s_errors, self.s_cancelled = count(), count(), count()
        self.s_closes, self.s_opened = count(), count()
        # (t_submit, t_start, t_end, t_return); t_end == t_return == 0.0 for
        # streams (their run is not timed)
        self.samples: deque[tuple[float, float, float, float]] = deque()
        self.sizes: deque[int] = deque()
        self.items = 0
        self.unread = 0  # items read ahead that no consumer took (under lock)
        self.hists: _Hists | None = None

    def _fold_into(
        self, admission: Histogram, run: Histogram, returned: Histogram, batch_size: Histogram
    ) -> int:
        """Move raw samples into these histograms (lock held); the items taken."""
        samples, sizes = self.samples, self.sizes
        if samples:
            _fold_latencies(samples, admission, run, returned)
        batch, items = batch_size.observe, 0
        for _ in range(len(sizes)):
            n = sizes.popleft()
            items += n
            batch(n)
        return items

    def fold(self) -> None:
        """Move raw samples into the histograms (any thread)."""
        with _lock:
            h = self.hists
            if h is None:
                h = self.hists = _Hists()
            self.items += self._fold_into(h.admission, h.run, h.returned, h.batch_size)

    def read(self) -> Totals:
        self.fold()
        t = Totals()
        self._add_counts(t)
        with _lock:
            s = t.streams
            h = self.hists
            s["items"], s["unread"] = self.items, self.unread
            if h is not None:
                s["wakeups"] = h.batch_size.n
                h.merge_into(t)
        return t

    def _add_counts(self, t: Totals) -> None:
        """Add the counters to ``t``'s.  Outcomes before submissions: a call that
        ends between the two reads is then seen as still in flight, never as a
        negative count.  Stream counters are read only when one was opened."""
        c, s = t.calls, t.streams
        c["ok"] += _value(self.c_ok)
        c["errors"] += _value(self.c_errors)
        c["cancelled"] += _value(self.c_cancelled)
        c["caller_cancels"] += _value(self.c_caller_cancels)
        c["delivered_despite_cancel"] += _value(self.c_delivered)
        c["results_dropped"] += _value(self.c_dropped)
        opened = _value(self.s_opened)
        if opened:
            s["completed"] += _value(self.s_completed)
            s["errors"] += _value(self.s_errors)
            s["cancelled"] += _value(self.s_cancelled)
            s["consumer_closes"] += _value(self.s_closes)
        c["submitted"] += _value(self.c_submitted)
        s["opened"] += opened

    def retire_into(self, into: Totals) -> None:
        """Add these numbers to ``into``: the object is gone, so nothing records
        here any more.  Its raw samples go straight into ``into``'s histograms.

        An object that never had a call or stream (most results that come back
        as proxies are only read) costs two counter reads."""
        if not (_value(self.c_submitted) or _value(self.s_opened) or self.unread):
            return
        self._add_counts(into)
        with _lock:
            s = into.streams
            before = into.batch_size.n
            s["items"] += self.items + self._fold_into(
                into.admission, into.run, into.returned, into.batch_size
            )
            s["unread"] += self.unread
            h = self.hists
            if h is not None:
                h.merge_into(into)
            s["wakeups"] += into.batch_size.n - before


class Counters:
    """The counters of one kind of operation (calls or streams), bumped with ``next()``.

    The hot path bumps these directly (one C call each): submission on the
    caller, the outcome, keyed by :class:`Outcome`, where it is recorded
    (``Operation.record``).
    """

    __slots__ = ("submitted", "outcome")

    def __init__(
        self,
        submitted: itertools.count[int],
        ok: itertools.count[int],
        errors: itertools.count[int],
        cancelled: itertools.count[int],
    ) -> None:
        self.submitted = submitted
        self.outcome: dict[Outcome, itertools.count[int]] = {
            Outcome.OK: ok,
            Outcome.ERROR: errors,
            Outcome.CANCELLED: cancelled,
        }


class Metrics(metaclass=NoPublicConstructor):
    """Counters and latency histograms of one loop-affine object.

    Get it with :func:`loopbridge.metrics.metrics_of`; read it with
    :meth:`snapshot` or :meth:`totals`.  The recording methods are called by
    the core from any thread.
    """

    __slots__ = (
        "name", "_data", "calls", "streams", "_caller_cancels", "_s_closes", "_samples",
        "_sizes", "__weakref__",
    )  # fmt: skip
    _lb_factory = "loopbridge.metrics.metrics_of(proxy)"

    def __init__(self, name: str) -> None:
        if len(_dead) >= _FOLD_DEAD_AT:
            _fold_dead(blocking=False)
        self.name = name
        d = self._data = _Data()
        # Direct references for the hot path (one attribute load, no indirection).
        self.calls = Counters(d.c_submitted, d.c_ok, d.c_errors, d.c_cancelled)
        self.streams = Counters(d.s_opened, d.s_completed, d.s_errors, d.s_cancelled)
        self._caller_cancels, self._s_closes = d.c_caller_cancels, d.s_closes
        self._samples, self._sizes = d.samples, d.sizes
        ref = weakref.ref(self, _retire)
        _live[ref] = (name, d)

    def __repr__(self) -> str:
        return f"<loopbridge metrics of {self.name}>"

    # -- calls (any thread) -------------------------------------------------
    def returned(self, op: _Timed, t_return: float) -> None:
        """The caller received the outcome: record all three latencies at once."""
        if op.t_start:
            self._samples.append((op.t_submit, op.t_start, op.t_end, t_return))
            if len(self._samples) >= _FOLD_AT:
                self._data.fold()

    def cancelled(self) -> None:
        """The caller cancelled (counted in addition to how the call ended)."""
        next(self._caller_cancels)

    def delivered_despite_cancel(self) -> None:
        """A call's result reached its caller although the caller's cancel or
        timeout raced it (the cancel is re-delivered; see the cancellation contract)."""
        next(self._data.c_delivered)

    def result_dropped(self) -> None:
        """A call completed with a result its caller could not take (it left, or a
        ``KeyboardInterrupt`` ended its blocking wait)."""
        next(self._data.c_dropped)

    # -- streams (any thread) -----------------------------------------------
    def stream_ended(self, op: _Timed) -> None:
        """A stream ended: record its admission latency (if it started)."""
        if op.t_start:
            # Admission only: a stream's lifetime is set by its consumer.
            self._samples.append((op.t_submit, op.t_start, 0.0, 0.0))
            if len(self._samples) >= _FOLD_AT:
                self._data.fold()

    def stream_closed(self) -> None:
        """The consumer closed the stream before its end."""
        next(self._s_closes)

    def stream_unread(self, items: int) -> None:
        """A stream ended with ``items`` read ahead that its consumer never took."""
        d = self._data
        with _lock:
            d.unread += items

    def stream_batch(self, items: int) -> None:
        """The consumer took ``items`` items between two wake-ups."""
        self._sizes.append(items)
        if len(self._sizes) >= _FOLD_AT:
            self._data.fold()

    # -- reading ------------------------------------------------------------
    def fold(self) -> None:
        self._data.fold()

    def totals(self) -> Totals:
        return self._data.read()

    def snapshot(self) -> dict[str, Any]:
        """This object's numbers (see ``docs/metrics.md`` for every field)."""
        return {"name": self.name, **self._data.read().as_dict()}


# ------------------------------------------------------------------ registry
_live: dict[weakref.ref[Metrics], tuple[str, _Data]] = {}
_dead: deque[tuple[str, _Data]] = deque()
_retired: dict[str, Totals] = {}
_retired_lock = threading.Lock()


def _retire(ref: weakref.ref[Metrics], _exiting: Callable[[], bool] = sys.is_finalizing) -> None:
    # A weakref callback can run inside any allocation, even one made while a
    # lock below is held: do nothing here but atomic moves (a dict.pop and a
    # deque.append, each under its container's own lock on a free-threaded build).
    # Nothing at interpreter exit, where this module's globals may already be None.
    if _exiting():
        return
    entry = _live.pop(ref, None)
    if entry is not None:
        _dead.append(entry)


def _live_data() -> list[tuple[str, _Data]]:
    while True:
        try:
            return list(_live.values())
        except RuntimeError:  # pragma: no cover - resized by a collection meanwhile
            continue


def _fold_dead(blocking: bool = True) -> None:
    """Fold the numbers of collected objects into the per-name totals.

    Never from the weak reference's callback (see the module).  ``blocking``
    False: leave it to whoever holds the lock now (it folds them too).
    """
    lock = _retired_lock
    if not lock.acquire(blocking):
        return
    try:
        _drain_dead()
    finally:
        lock.release()


def _drain_dead() -> None:
    """Fold the dead list into the per-name totals (``_retired_lock`` held)."""
    while _dead:
        name, data = _dead.popleft()
        into = _retired.get(name)
        if into is None:
            into = _retired[name] = Totals()
        data.retire_into(into)


def totals_by_name() -> dict[str, Totals]:
    """Totals per object name (live objects plus collected ones), sorted by name."""
    out: dict[str, Totals] = {}
    with _retired_lock:
        _drain_dead()
        for name, retired in list(_retired.items()):
            out[name] = t = Totals()
            t.add(retired)
    for name, data in _live_data():
        into = out.get(name)
        if into is None:
            out[name] = into = Totals()
        into.add(data.read())
    return dict(sorted(out.items()))


def _after_fork_in_child() -> None:
    """A thread that held a lock at a fork does not exist in the child."""
    global _retired_lock, _lock
    _retired_lock = threading.Lock()
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)
