"""Give an engine a loop of its own, on a dedicated thread, away from the actor's loop.

An RL framework's Ray actor often builds its engine on the actor's own event loop,
which also runs training calls, weight refits and every other actor method. A
request for the engine then waits behind whatever that loop is doing: admission,
the output handler and every stream's pump all share it. :class:`EngineLoop`
builds the engine on a loop that runs nothing else, so the actor's work never sits
in front of the engine's; the actor (and the servers) reach the engine through
loopbridge's proxies, whose calls cross to the engine's loop::

    engine_loop = EngineLoop("engine-loop").start()
    engine = await engine_loop.abuild(AsyncLLM.from_engine_args, engine_args)  # in the actor
    server = await astart_openai_server(engine)  # serves it from its own thread
    ...
    await engine_loop.arun(shutdown, engine)  # the engine's own teardown, on its loop
    engine_loop.stop()

The loop is uvloop when uvloop is installed (:func:`engine_loop_factory`), the choice
``vllm serve`` makes for its engine's loop and Ray makes for an async actor's loop
(unless ``RAY_USE_UVLOOP`` is off): an engine reached through loopbridge then runs on
the same kind of loop as the stock server's.  ``use_uvloop=False`` keeps asyncio's.

The engine is *created* there rather than moved with :func:`loopbridge.transfer`:
an engine that started tasks on the loop it was built on (vLLM's output handler,
SGLang's tokenizer manager loops) keeps them on that loop, and ``transfer`` moves
the ownership record, not running tasks.

Invariants: ``use_uvloop=True`` without uvloop fails in the constructor, naming the
fix, before any thread starts; the factory runs on the engine's loop, so everything the engine
starts while it is built belongs to that loop; :meth:`EngineLoop.abuild` and
:meth:`EngineLoop.arun` never block the calling loop; the thread is a
:class:`loopbridge.LoopThread`, whose ``stop`` cancels what is left on the loop,
closes it and joins the thread with a bound.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, overload

from loopbridge import LoopAffinityError, LoopThread

__all__ = ["EngineLoop", "engine_loop_factory", "loop_kind"]

T = TypeVar("T")


def engine_loop_factory(use_uvloop: bool | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop an engine's own loop runs on.

    ``None``: uvloop when it is installed, else asyncio's (what ``vllm serve`` and Ray's
    async actors choose); ``True``: uvloop, or :class:`ImportError` naming the fix;
    ``False``: asyncio's.
    """
    if use_uvloop is False:
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as exc:
        if use_uvloop:
            raise ImportError(
                "uvloop was asked for the engine's loop but is not installed: "
                "pip install uvloop, or choose asyncio's loop (use_uvloop=False, --no-uvloop)"
            ) from exc
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"``: which implementation ``loop`` is, for logs and reports."""
    return "uvloop" if type(loop).__module__.partition(".")[0] == "uvloop" else "asyncio"


class EngineLoop:
    """A dedicated thread whose event loop owns one engine (or a few objects with it)."""

    def __init__(self, name: str = "engine-loop", *, use_uvloop: bool | None = None) -> None:
        self._thread = LoopThread(name, loop_factory=engine_loop_factory(use_uvloop))

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The engine's loop (started)."""
        return self._thread.loop

    @property
    def kind(self) -> str:
        """``"uvloop"`` or ``"asyncio"`` (started)."""
        return loop_kind(self.loop)

    @property
    def running(self) -> bool:
        return self._thread.running

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    @overload
    def build(self, factory: Callable[..., Awaitable[T]], *args: Any) -> T: ...
    @overload
    def build(self, factory: Callable[..., T], *args: Any) -> T: ...
    def build(self, factory: Callable[..., Any], *args: Any) -> Any:
        """``factory(*args)`` called on the engine's loop (awaited if it returns an awaitable).

        Blocks the calling thread: from a loop (an async actor method) use :meth:`abuild`.
        """
        return self._thread.run(_call, factory, *args)

    @overload
    async def abuild(self, factory: Callable[..., Awaitable[T]], *args: Any) -> T: ...
    @overload
    async def abuild(self, factory: Callable[..., T], *args: Any) -> T: ...
    async def abuild(self, factory: Callable[..., Any], *args: Any) -> Any:
        """:meth:`build` from another loop, which keeps running while the engine is built."""
        return await self.arun(_call, factory, *args)

    async def arun(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Await ``fn(*args)`` run on the engine's loop, from another loop."""
        loop = self.loop
        if asyncio.get_running_loop() is loop:
            raise LoopAffinityError(
                "EngineLoop.arun() on the engine's own loop: await the call directly there"
            )
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), loop))

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop (what is left on it is cancelled) and join the thread."""
        self._thread.stop(timeout)

    def __enter__(self) -> EngineLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _call(factory: Callable[..., Any], *args: Any) -> Any:
    result = factory(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
