"""Declaring ownership (:mod:`loopbridge._declare`): an instance of a ``@loop_affine``
class belongs to the loop that constructs it, and ``adopt`` declares an instance of
a class loopbridge does not own.

``transfer`` is tested with the ownership records it swaps (test_ownership.py);
subclasses in test_affinity.py; slots, copies and pickles in test_slots_and_copies.py.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import loopbridge as lb

from .conftest import Engine, until_set


def test_ownership_is_the_constructing_loop(owner: lb.LoopThread, engine: Engine) -> None:
    assert lb.owner_loop(engine) is owner.loop
    assert lb.owner_loop(lb.proxy(engine)) is owner.loop


def test_adopt_a_foreign_instance(asyncio_owner: lb.LoopThread) -> None:
    class Foreign:  # a class we don't own
        def __init__(self) -> None:
            self.config = {"k": 1}
            self.event = asyncio.Event()
            self.waiting = threading.Event()

        async def wait_and_get(self) -> str:
            self.waiting.set()
            await self.event.wait()
            return "woken"

        async def set(self) -> None:
            self.event.set()

    async def make() -> Foreign:
        return lb.adopt(Foreign(), stable=("config",))

    obj = asyncio_owner.run(make)
    p = lb.proxy(obj)
    assert p.config == {"k": 1}
    assert lb.owner_loop(obj) is asyncio_owner.loop
    with pytest.raises(lb.LoopAffinityError):
        lb.adopt(obj)

    async def main() -> None:
        waiter = asyncio.create_task(p.wait_and_get())
        await until_set(obj.waiting)
        await p.set()
        assert await waiter == "woken"

    asyncio.run(main())
