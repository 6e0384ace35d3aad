"""Public types that only loopbridge builds (:mod:`loopbridge._construction`):
calling the class is a ``TypeError`` that names the factory, and the factories
still make them.
"""

from __future__ import annotations

import importlib

import pytest

import loopbridge


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("loopbridge", "Blocking"),
        ("loopbridge", "BlockingStream"),
        ("loopbridge.metrics", "Metrics"),
        ("loopbridge.metrics", "LagMonitor"),
    ],
)
def test_factory_made_types_refuse_construction(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    with pytest.raises(TypeError, match="has no public constructor; get one from"):
        cls()


def test_factory_made_types_still_come_from_their_factories() -> None:
    import loopbridge.metrics as metrics

    @loopbridge.loop_affine
    class Box:
        async def get(self) -> int:
            return 1

    with loopbridge.LoopThread(name="api-owner") as owner:
        box = owner.run(_make, Box)
        face = loopbridge.blocking(box)
        assert isinstance(face, loopbridge.Blocking)
        assert face.get() == 1
        assert isinstance(metrics.metrics_of(loopbridge.proxy(box)), metrics.Metrics)
        with metrics.monitor_lag(owner.loop) as mon:
            assert isinstance(mon, metrics.LagMonitor)


async def _make(cls: type) -> object:
    return cls()
