"""Starting owner-side tasks (:mod:`loopbridge._eager`): a call started eagerly (its
first step before any task, or in a task started eagerly) keeps its result, its
errors and its cancellation.
"""

from __future__ import annotations

import asyncio

import pytest

import loopbridge as lb

from .conftest import Engine, cancel_once_sleeping, tasks_on


def test_eager_calls_keep_results_errors_and_cancellation(
    owner: lb.LoopThread, engine: Engine
) -> None:
    p = lb.proxy(engine, eager=True)

    async def main() -> None:
        assert await p.echo(3) == 3  # finishes in its first step: no task at all
        assert await p.where() is owner.loop  # suspends: continues in a task
        with pytest.raises(ValueError, match="eager"):
            await p.fail("eager")
        await cancel_once_sleeping(p, engine, "stop")

    asyncio.run(main())
    assert lb.blocking(p).echo(4) == 4
    assert not tasks_on(owner.loop)
