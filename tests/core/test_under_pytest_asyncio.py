"""The proxy used from pytest-asyncio's own event loop (a foreign loop to the owner)."""

from __future__ import annotations

import asyncio

import pytest

import loopbridge as lb
import loopbridge.metrics

from .conftest import Engine, until_set


@pytest.mark.asyncio
async def test_calls_and_streams_from_the_test_loop(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine)
    assert await p.where() is owner.loop
    assert asyncio.get_running_loop() is not owner.loop
    assert [x async for x in p.count(100)] == list(range(100))


@pytest.mark.asyncio
async def test_timeout_on_the_caller_cancels_the_owner(
    owner: lb.LoopThread, engine: Engine
) -> None:
    p = lb.proxy(engine)
    call = asyncio.ensure_future(p.sleep(30))
    await until_set(engine.started["sleep"])
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(call, 0)  # times out now: cancels the call
    assert engine.log[0][0] == "cancelled" and engine.log[0][2] is owner.loop
    assert engine.log[1][0] == "cleanup done"


@pytest.mark.asyncio
async def test_object_owned_by_the_test_loop_goes_straight_through() -> None:
    e = Engine()  # created on pytest-asyncio's loop: owned by it
    p = lb.proxy(e)
    assert lb.owner_loop(e) is asyncio.get_running_loop()
    assert await p.echo(5) == 5
    assert lb.metrics.metrics_of(p).snapshot()["calls"] == 0  # no call crossed a loop
