"""Where a threaded server serves: a thread of its own, or the engine's owner loop.

A :class:`~loopbridge_adapters.threaded.ThreadedServer` holds one :class:`Topology`,
picked once when it is made (``on_engine_loop``); everything that differs between the
two is a method here, so no step of the server's life asks which one it has:

* :class:`OwnThread` (the default): a :class:`loopbridge.LoopThread` of the server's
  own, whose loop runs nothing else (uvloop when installed); serving's end stops that
  loop, and the loop thread sweeps what is left and closes it. The watchdog watches the
  engine's owner loop from there.
* :class:`OnEngineLoop`: the engine's owner loop itself, the stock servers' topology
  (no request crosses a thread; for an engine on a loop that runs nothing else). It
  has no loop of its own to choose (``use_uvloop`` is refused), its thread is the
  owner's once serving began, serving is started there through loopbridge's own
  crossing (:mod:`loopbridge_adapters.on_loop`), its end leaves the loop running, and
  the watchdog cannot see that loop stop: it runs there.

Invariants: :meth:`Topology.launch` runs ``begin`` on the serving loop before it
returns, or raises (:class:`TimeoutError` from :class:`OnEngineLoop` only when the
owner loop never ran it, so nothing was started); :meth:`Topology.thread` is a thread
that never runs until serving has a thread.
"""

from __future__ import annotations

import abc
import asyncio
import threading
from collections.abc import Callable
from typing import ClassVar

from loopbridge import LoopThread

from .on_loop import run_on

__all__ = ["OnEngineLoop", "OwnThread", "Topology"]


class Topology(abc.ABC):
    """What differs between serving on a thread of one's own and on the owner loop."""

    #: Whether this is the engine's owner loop (the servers' ``on_engine_loop``).
    on_engine_loop: ClassVar[bool]
    #: What a stop that timed out says the server ran on.
    where: ClassVar[str]

    def __init__(self, name: str) -> None:
        # What `thread` is before serving has one: a thread that never runs.
        self._not_started = threading.Thread(name=f"{name} (not started)")

    @property
    @abc.abstractmethod
    def thread(self) -> threading.Thread:
        """The thread the server serves on (one that never runs, before that)."""

    @abc.abstractmethod
    def launch(
        self,
        owner: Callable[[], asyncio.AbstractEventLoop],
        begin: Callable[[], None],
        timeout: float,
    ) -> asyncio.AbstractEventLoop:
        """Run ``begin`` (which starts serving) on the serving loop; return that loop.

        ``owner`` gives the engine's running owner loop, or raises the start error.
        """

    @abc.abstractmethod
    def wait_ended(
        self, ended: threading.Event, loop: asyncio.AbstractEventLoop, timeout: float | None
    ) -> bool:
        """Wait until serving (``ended``) on ``loop`` is over, and what it ran on with it."""

    def after_serving(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the serving loop, once serving has ended."""
        return None

    def watched(self, owner: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop | None:
        """The owner loop the watchdog can see stop (None: none)."""
        return owner


class OwnThread(Topology):
    """A loop thread of the server's own."""

    on_engine_loop = False
    where = "thread"

    def __init__(self, name: str, use_uvloop: bool | None) -> None:
        super().__init__(name)
        # The same loop thread as an owner loop's: start, clean-up sweep, close; its
        # loop's kind is fixed here (a missing uvloop fails before the socket is bound).
        self._loop_thread = LoopThread(name, use_uvloop=use_uvloop)

    @property
    def thread(self) -> threading.Thread:
        return self._loop_thread.thread or self._not_started

    def launch(
        self,
        owner: Callable[[], asyncio.AbstractEventLoop],
        begin: Callable[[], None],
        timeout: float,
    ) -> asyncio.AbstractEventLoop:
        self._loop_thread.start()
        self._loop_thread.run(begin)  # a fresh loop: it answers at once
        return self._loop_thread.loop

    def wait_ended(
        self, ended: threading.Event, loop: asyncio.AbstractEventLoop, timeout: float | None
    ) -> bool:
        # Serving's end stops the loop; the thread ends once its sweep has closed it.
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def after_serving(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.stop()  # the loop thread then sweeps the remaining tasks and closes it


class OnEngineLoop(Topology):
    """The engine's owner loop, shared with the engine."""

    on_engine_loop = True
    where = "on the engine's owner loop"

    def __init__(self, name: str, use_uvloop: bool | None) -> None:
        if use_uvloop is not None:
            raise ValueError(
                f"use_uvloop={use_uvloop!r} picks the loop of the server's own thread; a "
                "server on the engine's loop runs on that loop, whichever kind it is: leave "
                "use_uvloop out"
            )
        super().__init__(name)
        self._serving_thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread:
        return self._serving_thread or self._not_started

    def launch(
        self,
        owner: Callable[[], asyncio.AbstractEventLoop],
        begin: Callable[[], None],
        timeout: float,
    ) -> asyncio.AbstractEventLoop:
        loop = owner()
        # A blocked owner loop makes this time out; a call it never started is taken back.
        run_on(loop, self._begin_here, begin, timeout=timeout)
        return loop

    def _begin_here(self, begin: Callable[[], None]) -> None:
        self._serving_thread = threading.current_thread()
        begin()

    def wait_ended(
        self, ended: threading.Event, loop: asyncio.AbstractEventLoop, timeout: float | None
    ) -> bool:
        # A closed owner loop dropped (or cancelled) the serving task: nothing to wait for.
        return ended.wait(timeout) or loop.is_closed()

    def watched(self, owner: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop | None:
        return None  # the watchdog runs on the owner loop: it cannot see that loop stop
