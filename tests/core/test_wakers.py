"""How a caller waits (:mod:`loopbridge._wakers`): a parked caller notices that its
owner loop died, and fails with ``OwnerLoopClosed`` instead of waiting for ever.
"""

from __future__ import annotations

import threading

import loopbridge as lb

from .conftest import make_engine as _make


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
