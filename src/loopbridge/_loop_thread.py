"""An owner loop on a dedicated thread, for code that has no loop of its own.

Invariants: the loop's kind is fixed in the constructor (``use_uvloop=True`` without
uvloop fails there, naming the fix, before any thread starts); ``run`` and ``arun``
call their function on the loop, so whatever it creates (tasks, loop-affine objects)
belongs to that loop; ``arun`` never blocks the calling loop; neither is allowed on
the loop's own thread, where the call needs no crossing (and ``run`` would deadlock).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from ._errors import Advice, Fix, fork_advice, gone, refuse
from ._labels import name_loop

__all__ = ["LoopThread"]

R = TypeVar("R")
_T = TypeVar("_T", bound="LoopThread")


class LoopThread:
    """Run an event loop on its own thread, with a clean start and stop.

    ::

        with LoopThread(name="engine-owner") as owner:
            engine = owner.run(make_engine)      # constructed on the owner loop
            p = loopbridge.proxy(engine)         # usable from anywhere

    :meth:`stop` cancels the loop's remaining tasks, closes its async generators
    and its default executor, then closes the loop and joins the thread.  Calls
    still waiting on it through proxies fail with :class:`OwnerLoopClosed`.

    The loop is uvloop when uvloop is installed (``use_uvloop=None``, the default),
    as ``vllm serve``, SGLang and Ray's async actors choose; ``use_uvloop=True``
    insists on it (``ImportError`` naming the fix without it), ``use_uvloop=False``
    keeps asyncio's own loop, and ``loop_factory`` makes any other.

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
        use_uvloop: bool | None = None,
    ) -> None:
        if use_uvloop is not None and loop_factory is not None:
            raise ValueError(
                f"LoopThread {name!r} was given both loop_factory and use_uvloop: pass one "
                "(loop_factory makes the loop, use_uvloop picks uvloop or asyncio's)"
            )
        self.name = name
        self._factory = loop_factory or event_loop_factory(use_uvloop, f"LoopThread {name!r}")
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

    def start(self: _T) -> _T:
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

    def _reachable(self, method: str) -> asyncio.AbstractEventLoop:
        """The loop, for ``method`` (``run`` or ``arun``) called here; refused if the
        thread is gone, or if this is the loop's own thread."""
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
            outcome, reason = _ON_OWN_THREAD[method]
            raise refuse(
                Advice(
                    f"LoopThread {self.name!r}.{method}() called on its own thread {outcome}",
                    [Fix("owner", "fn(*args)", target="fn", say="await on its own loop")],
                    reason,
                )
            )
        return loop

    @overload
    def run(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R: ...
    @overload
    def run(self, fn: Callable[..., R], *args: Any) -> R: ...
    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn(*args)`` on the loop (awaited there if it returns an awaitable) and
        block until it returns; from a loop, use :meth:`arun`."""
        loop = self._reachable("run")
        return asyncio.run_coroutine_threadsafe(_call(fn, args), loop).result()

    @overload
    async def arun(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R: ...
    @overload
    async def arun(self, fn: Callable[..., R], *args: Any) -> R: ...
    async def arun(self, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`run` from another asyncio loop, which keeps running meanwhile.

        Cancelling the caller cancels ``fn``'s run on the loop.
        """
        loop = self._reachable("arun")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_call(fn, args), loop))

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

    def __enter__(self: _T) -> _T:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: Why ``run`` and ``arun`` are refused on the loop's own thread: (what the call
#: would do, why).
_ON_OWN_THREAD = {
    "run": (
        "would deadlock",
        "run() blocks its caller until the loop has run fn, and this thread is the loop's.",
    ),
    "arun": ("crosses nothing", "arun() carries fn to the loop, and this is the loop."),
}


async def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def event_loop_factory(
    use_uvloop: bool | None, who: str = "the loop"
) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes ``who``'s loop: ``None``, uvloop when it is installed, else asyncio's;
    ``True``, uvloop (:class:`ImportError` naming the fix without it); ``False``,
    asyncio's."""
    if use_uvloop is False:
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        if use_uvloop:
            raise ImportError(
                f"{who} was asked to run on uvloop (use_uvloop=True), which is not "
                "installed: pip install uvloop (loopbridge[uvloop]), or leave use_uvloop "
                "out (uvloop when installed, else asyncio's loop)"
            ) from exc
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


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
