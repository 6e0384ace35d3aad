"""Uncovered results (:mod:`loopbridge._uncovered`): a loop-bound result no rule
covers comes back as a tripwire that is not a proxy.

The tripwire once carried the proxy marker, so ``is_proxy`` said True for it and
``loopbridge.metrics.metrics_of`` failed with ``AttributeError`` (it has no proxy
settings) instead of its documented ``TypeError``.
"""

from __future__ import annotations

import asyncio

import pytest

import loopbridge as lb
import loopbridge.metrics


@lb.loop_affine
class Source:
    async def bare_future(self) -> asyncio.Future[int]:  # no rule covers it
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(7)
        return fut


@pytest.fixture
def uncovered(owner: lb.LoopThread) -> object:
    async def make() -> Source:
        return Source()

    return lb.blocking(owner.run(make)).bare_future()


def test_an_uncovered_result_is_not_a_proxy(uncovered: object) -> None:
    assert isinstance(uncovered, asyncio.Future)  # still its own type
    assert not lb.is_proxy(uncovered)


def test_metrics_of_an_uncovered_result_is_a_type_error(uncovered: object) -> None:
    with pytest.raises(TypeError, match="expected a loopbridge proxy, got FutureUncovered"):
        loopbridge.metrics.metrics_of(uncovered)


def test_an_uncovered_result_still_unwraps_and_awaits_on_its_owner(
    owner: lb.LoopThread, uncovered: object
) -> None:
    fut = lb.unwrap(uncovered)
    assert type(fut) is asyncio.Future and fut.get_loop() is owner.loop
    assert lb.proxy(uncovered) is uncovered  # already what crosses: passed back unchanged
    assert lb.blocking(uncovered).result() == 7  # awaiting it: on the owner
    with pytest.raises(lb.LoopAffinityError, match=r"returns=\{'bare_future'"):
        uncovered.done()  # type: ignore[attr-defined]
