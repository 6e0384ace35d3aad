"""Start owner-side tasks eagerly where the runtime supports it.

On Python 3.12+ ``Task(..., eager_start=True)`` runs the first step of the
coroutine at once, inside the port's drain, with the task already current.  A
call that finishes without suspending then posts its result in the same loop
iteration that received it.  On 3.11 the task starts on the next iteration as
usual: a hand-rolled eager step there cost more CPU per call than it saved.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import sys
from typing import Any

__all__ = ["NATIVE_EAGER", "start_task", "step_then_task"]

_NATIVE = NATIVE_EAGER = sys.version_info >= (3, 12)
_PY311 = sys.version_info >= (3, 11)
_Task = asyncio.Task
_FACTORY = object()


def start_task(
    loop: asyncio.AbstractEventLoop, coro: Any, ctx: contextvars.Context
) -> asyncio.Task[Any]:
    """A task for ``coro`` in context ``ctx``, started eagerly where possible."""
    if not _PY311:  # 3.10: Task() has no context argument; it copies the current one
        return ctx.run(loop.create_task, coro)
    if getattr(loop, "_task_factory", _FACTORY) is not None:
        # A custom task factory (or uvloop, whose create_task is C): respect it.
        return loop.create_task(coro, context=ctx)
    if _NATIVE:
        return _Task(coro, loop=loop, context=ctx, eager_start=True)  # type: ignore[call-arg, unused-ignore]
    # Stock asyncio without a factory: what create_task does, minus its Python frame.
    return _Task(coro, loop=loop, context=ctx)


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
