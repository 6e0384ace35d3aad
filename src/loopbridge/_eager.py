"""Start owner-side tasks so that their first step runs at once.

A call that finishes without suspending should answer in the loop iteration
that received it, not one iteration later.  Every owner-side task therefore
runs its first step inside the port's drain, *with the task current* (so
``asyncio.current_task()``, ``asyncio.timeout()`` and anyio scopes work from
the first line):

* Python 3.12+: ``Task(..., eager_start=True)``;
* Python 3.11, stock asyncio: the task is created as usual and its first step,
  which ``Task()`` just queued, is taken back off the ready queue and run now
  (see :func:`~loopbridge._compat.step_now`);
* uvloop (C ``create_task``), custom task factories and 3.10: the task starts
  on the next iteration as usual.

``eager=True`` on 3.11 goes one step further (:func:`step_then_task`): the
first step runs with no task at all, and only a call that suspends gets one.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
from typing import Any

from ._compat import HAS_NATIVE_EAGER, HAS_TASK_CONTEXT, is_stock_loop, step_now

__all__ = ["NATIVE_EAGER", "start_task", "step_then_task"]

NATIVE_EAGER = HAS_NATIVE_EAGER
_Task = asyncio.Task


def start_task(
    loop: asyncio.AbstractEventLoop, coro: Any, ctx: contextvars.Context
) -> asyncio.Task[Any]:
    """A task for ``coro`` in context ``ctx``, its first step run now where possible."""
    if not HAS_TASK_CONTEXT:  # 3.10: Task() has no context argument; it copies the current one
        return ctx.run(loop.create_task, coro)
    if not is_stock_loop(loop) or loop.get_task_factory() is not None:
        # uvloop (whose create_task is C) or a custom task factory: respect it.
        return loop.create_task(coro, context=ctx)
    if HAS_NATIVE_EAGER:
        return _Task(coro, loop=loop, context=ctx, eager_start=True)  # type: ignore[call-arg, unused-ignore]
    # 3.11 stock asyncio: what create_task does, minus its Python frame, then the first step.
    task = _Task(coro, loop=loop, context=ctx)
    step_now(loop, task)
    return task


class _Resume(collections.abc.Coroutine):  # type: ignore[type-arg]
    """Continues, inside a task, a coroutine that was already stepped once."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Any, pending: Any) -> None:
        self.coro = coro
        self.pending = pending  # what the first step yielded

    def send(self, value: Any) -> Any:
        pending = self.pending
        if pending is not _EMPTY:
            self.pending = _EMPTY
            return pending
        return self.coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        # A cancel before the task's first step lands where the coroutine is
        # suspended, exactly as if the task had been running it all along.
        self.pending = _EMPTY
        if val is None and tb is None:
            return self.coro.throw(typ)
        return self.coro.throw(typ, val, tb)  # pragma: no cover - legacy signature

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Any:  # pragma: no cover - only ever run by a Task
        raise TypeError("internal coroutine wrapper")


_EMPTY = object()


def step_then_task(
    loop: asyncio.AbstractEventLoop, coro: Any, ctx: contextvars.Context
) -> asyncio.Task[Any] | None:
    """Python 3.11, opt-in: run the first step now, without a task.

    A coroutine that finishes in that step never gets a task (saving its
    creation and a loop iteration).  One that suspends continues in a task.
    During the first step ``asyncio.current_task()`` is ``None``, so code that
    needs a task there (``asyncio.timeout()``, ``TaskGroup``, anyio scopes)
    must not be called eagerly: that is why this is opt-in on 3.11.
    """
    try:
        yielded = ctx.run(coro.send, None)
    except (StopIteration, asyncio.CancelledError):
        return None  # finished (or cancelled itself); the call is settled
    return start_task(loop, _Resume(coro, yielded), ctx)
