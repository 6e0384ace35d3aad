"""An owner loop on a dedicated thread, for code that has no loop of its own."""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ._errors import Advice, Fix, fork_advice, gone, refuse
from ._labels import name_loop

__all__ = ["LoopThread"]

R = TypeVar("R")


class LoopThread:
    """Run an event loop on its own thread, with a clean start and stop.

    ::

        with LoopThread(name="engine-owner") as owner:
            engine = owner.run(make_engine)      # constructed on the owner loop
            p = loopbridge.proxy(engine)         # usable from anywhere

    :meth:`stop` cancels the loop's remaining tasks, closes its async generators
    and its default executor, then closes the loop and joins the thread.  Calls
    still waiting on it through proxies fail with :class:`OwnerLoopClosed`.

    A ``LoopThread`` does not survive ``os.fork()``: its thread exists only in the
    parent.  In a forked child, :meth:`run` and every call to an object it owns
    fail at once with :class:`OwnerLoopClosed`; create one after the fork (see
    "Forked workers" in docs/recipes.md).
    """

    def __init__(
        self,
        name: str = "loopbridge-owner",
        *,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        use_uvloop: bool = False,
    ) -> None:
        if use_uvloop and loop_factory is not None:
            raise ValueError("pass either loop_factory or use_uvloop, not both")
        if use_uvloop:
            import uvloop

            loop_factory = uvloop.new_event_loop
        self.name = name
        self._factory = loop_factory or asyncio.new_event_loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop_requested = False
        self._stop_lock = threading.Lock()
        self._forked = False  # this is a forked child's copy: its thread is gone

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise refuse(
                Advice(
                    f"LoopThread {self.name!r} is not started",
                    [Fix("run", "loop_thread.start()", target="loop_thread")],
                    "Its loop exists once start() returns.",
                )
            )
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread (``None`` before :meth:`start`)."""
        return self._thread

    def start(self) -> LoopThread:
        """Start the thread; return once its loop is running."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} was already started")
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        _started.add(self)
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        try:
            loop = self._factory()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._loop = loop
        name_loop(loop, f"LoopThread {self.name!r}")  # errors and metrics name it so
        asyncio.set_event_loop(loop)
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                _shutdown(loop)
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def run(self, fn: Callable[..., Awaitable[R]], *args: object) -> R:
        """Run ``fn(*args)`` on the loop and block until it returns."""
        loop = self.loop
        if self._forked:
            raise gone(fork_advice(f"LoopThread {self.name!r}", None))
        if not self.running:
            raise gone(
                Advice(
                    f"LoopThread {self.name!r} has stopped",
                    [Fix("run", "loopbridge.LoopThread().start()", target="loop_thread")],
                    "A LoopThread runs once; its objects move to another loop with "
                    "loopbridge.transfer(obj, loop).",
                )
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise refuse(
                Advice(
                    f"LoopThread {self.name!r}.run() called on its own thread would deadlock",
                    [Fix("owner", "fn(*args)", target="fn", say="await on its own loop")],
                    "run() blocks its caller until the loop has run fn, and this thread is the loop's.",
                )
            )

        async def main() -> R:
            return await fn(*args)

        return asyncio.run_coroutine_threadsafe(main(), loop).result()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop, clean it up and join the thread (bounded by ``timeout``)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None or not thread.is_alive():
            return
        if threading.current_thread() is thread:
            raise refuse(
                Advice(
                    f"LoopThread {self.name!r}.stop() called on its own thread would deadlock",
                    [
                        Fix(
                            "thread",
                            "loop_thread.stop()",
                            target="loop_thread",
                            say="from another thread use",
                        )
                    ],
                    "stop() joins the loop's thread, which is this one.",
                )
            )
        with self._stop_lock:
            # A second stop() only waits: stopping the loop again would cut its
            # clean-up short.
            first, self._stop_requested = not self._stop_requested, True
        if first:
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # already closed
                pass
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"{self.name} did not stop within {timeout} s")

    def __enter__(self) -> LoopThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_started: weakref.WeakSet[LoopThread] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Mark every started ``LoopThread`` as the parent's (its thread did not survive
    the fork; the loop ports' own hook fails what was in flight)."""
    survivor = threading.current_thread()
    for owner in list(_started):
        if owner._thread is survivor:  # forked from its own loop: it lives on here
            continue
        owner._forked = True
        owner._stop_lock = threading.Lock()  # another thread may have held it
        _started.discard(owner)


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _shutdown(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
