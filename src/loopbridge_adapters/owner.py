"""Naming the loop that will own an engine, before the engine starts.

An engine (vLLM's ``AsyncLLM``, SGLang's ``TokenizerManager``) starts its output
handler on the loop of its first request, and cannot move once it has. Each
adapter's ``bind_owner_loop`` lets a framework name that loop early (a Ray actor's
``post_init``); this is the one place that resolves the loop, refuses a move once
the handler runs elsewhere, and records the ownership.

Built on the core's public API only; imports no engine and no adapter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from loopbridge import LoopAffinityError, transfer, unwrap

__all__ = ["bind_before_start"]


def bind_before_start(
    obj: Any,
    loop: asyncio.AbstractEventLoop | None,
    *,
    handler_loop: Callable[[Any], asyncio.AbstractEventLoop | None],
    adopt: Callable[[Any], object],
    started_elsewhere: str,
) -> None:
    """Make ``loop`` (default: the running one) the owner of ``obj`` (or of the
    object a proxy ``obj`` stands for).

    ``handler_loop`` tells where the engine's handler runs, if it has started;
    ``adopt`` declares the engine loop-affine; ``started_elsewhere`` is the error
    for an engine whose handler already runs on another loop.
    """
    obj = unwrap(obj)
    target = loop
    if target is None:
        try:
            target = asyncio.get_running_loop()
        except RuntimeError:
            raise LoopAffinityError(
                "bind_owner_loop() needs a loop: pass one or call it on the owner loop"
            ) from None
    running = handler_loop(obj)
    if running is not None and running is not target:
        raise LoopAffinityError(started_elsewhere)
    adopt(obj)
    transfer(obj, target)
