"""What a call and a stream share (:mod:`loopbridge._operation`): starting on the
owner, where a start that fails fails the operation instead of leaving its caller
waiting.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import loopbridge as lb


def test_an_owner_side_start_that_raises_fails_the_call(asyncio_owner: lb.LoopThread) -> None:
    """A task factory that raises on the owner: the caller gets its error, not a hang."""

    class Service:
        async def ping(self) -> str:
            return "pong"

    async def make() -> Service:
        return lb.adopt(Service())

    p = lb.proxy(asyncio_owner.run(make))

    def broken_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        coro.close()
        raise RuntimeError("task factory broken")

    async def install(factory: Any) -> None:
        asyncio.get_running_loop().set_task_factory(factory)

    asyncio_owner.run(install, broken_factory)
    try:

        async def main() -> None:
            with pytest.raises(RuntimeError, match="task factory broken"):
                await asyncio.wait_for(p.ping(), 30)  # a hang guard: fails in ms
            with pytest.raises(RuntimeError, match="task factory broken"):
                await asyncio.wait_for(p.ping(), 30)  # the port still serves

        asyncio.run(main())
        with pytest.raises(RuntimeError, match="task factory broken"):
            lb.blocking(p).ping()
    finally:
        # Not through run(): that makes its task with the factory.  Callbacks
        # run in order, so whatever comes next on this loop sees no factory.
        asyncio_owner.loop.call_soon_threadsafe(asyncio_owner.loop.set_task_factory, None)
