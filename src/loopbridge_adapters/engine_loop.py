"""Deprecated: an engine's loop of its own is a :class:`loopbridge.LoopThread`.

``EngineLoop`` was a loop thread for an engine, beside the core's; the core's now does
all it did: its loop is uvloop when installed, ``build``/``abuild`` are its
``run``/``arun`` (which call sync factories too), and its errors name the fix::

    engine_loop = loopbridge.LoopThread("engine-loop").start()
    engine = await engine_loop.arun(AsyncLLM.from_engine_args, engine_args)

:class:`EngineLoop` stays, as a :class:`~loopbridge.LoopThread` that warns once it is
made, for code written against it.
"""

from __future__ import annotations

import warnings

from loopbridge import LoopThread

from .http import loop_kind

__all__ = ["EngineLoop"]


class EngineLoop(LoopThread):
    """Deprecated: :class:`loopbridge.LoopThread` (``build`` is its ``run``, ``abuild``
    its ``arun``)."""

    def __init__(self, name: str = "engine-loop", *, use_uvloop: bool | None = None) -> None:
        warnings.warn(
            "EngineLoop is deprecated: use loopbridge.LoopThread (its run/arun are "
            "EngineLoop's build/abuild; its loop is uvloop when installed)",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(name, use_uvloop=use_uvloop)

    @property
    def kind(self) -> str:
        """``"uvloop"`` or ``"asyncio"`` (started)."""
        return loop_kind(self.loop)

    build = LoopThread.run
    abuild = LoopThread.arun
