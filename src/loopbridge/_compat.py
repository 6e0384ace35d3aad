"""Every use of a private CPython or asyncio internal, in one place.

The hot path leans on a few internals because their public counterparts cost
more than the work around them (a ``getpid()`` system call per
``asyncio.get_running_loop()`` on 3.11, a loop iteration per task start).  Each
one is checked where its absence would otherwise go unnoticed:

* process-wide facts at import of this module;
* per-loop facts by :func:`check_loop`, once per loop, when loopbridge first
  talks to it.

A missing internal raises :class:`UnsupportedRuntime` naming it, never a silent
fallback to a slower or subtly different path.  Supported: CPython 3.10 to 3.13
(3.13t, the free-threaded build, with the GIL on or off), stock asyncio and uvloop (uvloop's loops are used only through public methods),
trio (public ``trio.lowlevel`` API only).
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import collections
import itertools
import sys
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from ._errors import UnsupportedRuntime

__all__ = [
    "UnsupportedRuntime",
    "gil_enabled",
    "get_running_loop",
    "counter_value",
    "is_stock_loop",
    "check_loop",
    "ready_queue",
    "self_reader",
    "callback_of",
    "THREAD_ID_ATTR",
    "TASK_FACTORY_ATTR",
    "mark_coroutine_function",
    "MARKS_COROUTINE_FUNCTIONS",
    "HAS_NATIVE_EAGER",
    "HAS_TASK_CONTEXT",
    "thread_id_of",
    "live_thread",
]

_VERSION = ".".join(map(str, sys.version_info[:3]))


def require(ok: bool, internal: str, used_for: str) -> None:
    """Raise :class:`UnsupportedRuntime` unless ``ok``."""
    if not ok:
        raise UnsupportedRuntime(
            f"loopbridge relies on {internal} ({used_for}), which Python {_VERSION} "
            f"({sys.implementation.name}) does not provide in the expected form"
        )


# -------------------------------------------------------------- process-wide
def gil_enabled() -> bool:
    """Whether the GIL is on (always, before free-threaded builds existed)."""
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_gil_enabled is None else bool(is_gil_enabled())


require(
    callable(getattr(asyncio, "_get_running_loop", None)),
    "asyncio._get_running_loop()",
    "the cheapest 'which loop runs on this thread', None instead of an exception",
)
#: C-accelerated and returns None instead of raising.
get_running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop


class _Counter(Protocol):
    def __next__(self) -> object: ...


def check_counter_repr(count: Callable[[], _Counter] = itertools.count) -> None:
    """``repr(itertools.count())`` is ``count(N)``: counters readable without a lock."""
    c = count()
    next(c)
    next(c)
    require(
        repr(c) == "count(2)",
        "repr(itertools.count) == 'count(N)'",
        "exact counters bumped from any thread and read without advancing them",
    )


check_counter_repr()


def counter_value(counter: itertools.count[int]) -> int:
    """Current value of an ``itertools.count`` without advancing it.

    ``repr`` reads the count's one machine word, which ``next()`` changes by a
    compare-and-swap on a free-threaded build: an aligned word, read whole on
    the 64-bit platforms that build runs on (a value a moment old at worst)."""
    return int(repr(counter)[6:-1])


#: Python 3.12+: ``Task(..., eager_start=True)``.
HAS_NATIVE_EAGER = sys.version_info >= (3, 12)
#: Python 3.11+: ``Task(..., context=ctx)``.
HAS_TASK_CONTEXT = sys.version_info >= (3, 11)

#: A function to mark, given back as it was.
_Fn = TypeVar("_Fn", bound=Callable[..., object])

#: Python 3.12+: a plain function marked by :func:`mark_coroutine_function` is a
#: coroutine function to ``inspect.iscoroutinefunction`` too.  Before 3.12 the mark
#: convinces ``asyncio.iscoroutinefunction`` only: inspect reads the code's
#: CO_COROUTINE flag, which only an ``async def`` has.
MARKS_COROUTINE_FUNCTIONS = sys.version_info >= (3, 12)

if sys.version_info >= (3, 12):
    import inspect

    mark_coroutine_function = inspect.markcoroutinefunction
else:
    _IS_COROUTINE = getattr(asyncio.coroutines, "_is_coroutine", None)
    require(
        _IS_COROUTINE is not None,
        "asyncio.coroutines._is_coroutine",
        "marking a generated wrapper as a coroutine function before 3.12",
    )

    def mark_coroutine_function(fn: _Fn) -> _Fn:
        fn._is_coroutine = _IS_COROUTINE  # type: ignore[attr-defined]
        return fn


# ------------------------------------------------------------------ per loop
#: Stock asyncio loops hold the ident of the thread running them (None when not
#: running): comparing it with ``threading.get_ident()`` answers "does this
#: thread run the loop" without ``get_running_loop()``'s ``getpid()`` on 3.11.
THREAD_ID_ATTR = "_thread_id"


#: Stock loops keep their task factory here (None: none set); reading it is one
#: C-level getattr per task, where ``get_task_factory()`` is a Python call.
TASK_FACTORY_ATTR = "_task_factory"


def is_stock_loop(loop: object) -> bool:
    """A loop built on ``asyncio.BaseEventLoop`` (the stock selector/proactor loops)."""
    return isinstance(loop, asyncio.BaseEventLoop)


def check_loop(loop: object) -> None:
    """Check the per-loop internals once, when loopbridge first meets ``loop``."""
    if not is_stock_loop(loop):
        return  # uvloop and others: only public methods are used
    require(
        hasattr(loop, THREAD_ID_ATTR),
        f"BaseEventLoop.{THREAD_ID_ATTR}",
        "telling the owner loop's thread apart without a system call",
    )
    require(
        hasattr(loop, TASK_FACTORY_ATTR),
        f"BaseEventLoop.{TASK_FACTORY_ATTR}",
        "starting owner-side tasks without a Python-level call per task",
    )
    require(
        isinstance(getattr(loop, "_ready", None), collections.deque),
        "BaseEventLoop._ready (a deque)",
        "deferring a wake-up while the posting loop has more ready work",
    )
    if isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop):
        require(
            callable(getattr(loop, "_read_from_self", None)),
            "BaseSelectorEventLoop._read_from_self",
            "not counting the loop's own wake-up reader as more ready work",
        )


# The ready handles of a stock loop name their callback here.
require(
    "_callback" in getattr(asyncio.Handle, "__slots__", ()),
    "asyncio.Handle._callback",
    "not counting the loop's own wake-up reader as more ready work",
)


def callback_of(handle: asyncio.Handle) -> Callable[..., object]:
    """What a ready handle of a stock loop will call."""
    return handle._callback  # type: ignore[attr-defined, no-any-return]


def self_reader(loop: object) -> Callable[[], object] | None:
    """The callback a stock selector loop runs when another thread wakes it
    (None for other loops: their wake-up is not a ready handle)."""
    if isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop):
        return loop._read_from_self  # type: ignore[attr-defined, no-any-return]
    return None


def ready_queue(loop: object) -> collections.deque[asyncio.Handle] | None:
    """The ready queue of a stock loop (checked by :func:`check_loop`), else None."""
    return loop._ready if is_stock_loop(loop) else None  # type: ignore[attr-defined]


def thread_id_of(loop: object) -> int | None:
    """The thread running a stock loop now (None when not running or not stock)."""
    return getattr(loop, THREAD_ID_ATTR, None) if is_stock_loop(loop) else None


require(
    isinstance(getattr(threading, "_active", None), dict),
    "threading._active (a dict of live threads by ident)",
    "naming a thread in a hang dump without the lock threading.enumerate() takes",
)


def live_thread(ident: int) -> threading.Thread | None:
    """The live thread ``ident``, read without a lock.

    ``threading.enumerate()`` takes the interpreter's thread-table lock, and a
    hang dump run from a signal handler may interrupt the very thread holding it.
    """
    return threading._active.get(ident)  # type: ignore[attr-defined, no-any-return]
