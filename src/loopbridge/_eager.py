"""Start owner-side tasks eagerly where the runtime supports it.

On Python 3.12+ ``Task(..., eager_start=True)`` runs the first step of the
coroutine at once, inside the port's drain, with the task already current.  A
call that finishes without suspending then posts its result in the same loop
iteration that received it.  On 3.11 the task starts on the next iteration as
usual: a hand-rolled eager step there cost more CPU per call than it saved.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from typing import Any

__all__ = ["start_task"]

_NATIVE = sys.version_info >= (3, 12)
_Task = asyncio.Task
_FACTORY = object()


def start_task(
    loop: asyncio.AbstractEventLoop, coro: Any, ctx: contextvars.Context
) -> asyncio.Task[Any]:
    """A task for ``coro`` in context ``ctx``, started eagerly where possible."""
    if getattr(loop, "_task_factory", _FACTORY) is not None:
        # A custom task factory (or uvloop, whose create_task is C): respect it.
        return loop.create_task(coro, context=ctx)
    if _NATIVE:
        return _Task(coro, loop=loop, context=ctx, eager_start=True)  # type: ignore[call-arg, unused-ignore]
    # Stock asyncio without a factory: what create_task does, minus its Python frame.
    return _Task(coro, loop=loop, context=ctx)
