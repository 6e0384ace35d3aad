"""Callers through anyio (its trio and asyncio backends) and on uvloop; what is
particular to trio callers is in test_trio.py."""

from __future__ import annotations

import asyncio

import anyio
import pytest
import uvloop

import loopbridge as lb

from .conftest import Engine


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_anyio_callers(owner: lb.LoopThread, engine: Engine, backend: str) -> None:
    p = lb.proxy(engine)

    async def main() -> None:
        assert await p.echo("x") == "x"
        assert await p.where() is owner.loop
        with pytest.raises(ValueError, match="nope"):
            await p.fail("nope")
        assert [i async for i in p.count(1000)] == list(range(1000))
        results: list[int] = []

        async def one(i: int) -> None:
            results.append(await p.echo(i))

        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(one, i)
        assert sorted(results) == list(range(100))

    anyio.run(main, backend=backend)


def test_uvloop_caller(asyncio_owner: lb.LoopThread) -> None:
    async def make() -> Engine:
        return Engine()

    p = lb.proxy(asyncio_owner.run(make))

    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        assert await p.where() is asyncio_owner.loop
        assert sum(await asyncio.gather(*(p.echo(i) for i in range(500)))) == sum(range(500))
        assert [i async for i in p.count(2000)] == list(range(2000))

    uvloop.run(main())
