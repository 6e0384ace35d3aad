"""How a caller waits (:mod:`loopbridge._wakers`): a parked caller notices that its
owner loop died, and fails with ``OwnerLoopClosed`` instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
import threading

import loopbridge as lb

from .conftest import make_engine as _make
from .interleave import BOUND, wait_until_waiting


def test_blocking_caller_sees_owner_death() -> None:
    owner = lb.LoopThread().start()
    engine = owner.run(_make)
    b = lb.blocking(engine)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            b.sleep(30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=caller)
    t.start()
    assert engine.started["sleep"].wait(30)
    owner.stop()
    t.join(5)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], lb.OwnerLoopClosed)


@lb.loop_affine
class Latch:
    """A call that returns once the latch is opened on its owner loop (``waiting``:
    set once a call has started there)."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.waiting = threading.Event()

    async def wait(self) -> str:
        self.waiting.set()
        await self.opened.wait()
        return "opened"


def test_a_timeout_longer_than_a_lock_wait_can_take_is_a_timeout_all_the_same() -> None:
    """A blocking face's timeout past ``threading.TIMEOUT_MAX`` waits like any other
    (a lock wait given it raises ``OverflowError``)."""

    async def make() -> Latch:
        return Latch()

    with lb.LoopThread(name="long-timeout") as owner:
        latch = owner.run(make)
        face = lb.blocking(lb.proxy(latch), timeout=threading.TIMEOUT_MAX * 10)
        got: list[object] = []

        def caller() -> None:
            try:
                got.append(face.wait())
            except BaseException as exc:
                got.append(exc)

        t = threading.Thread(target=caller, name="long-timeout caller")
        t.start()
        wait_until_waiting(t)  # parked: the owner has not answered
        owner.run(latch.opened.set)
        t.join(BOUND)
        assert got == ["opened"]
