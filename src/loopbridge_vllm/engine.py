"""vLLM's ``AsyncLLM`` behind a loop-affine proxy that any thread or loop may use.

``AsyncLLM`` is a single-loop object: its output handler, its ZMQ client tasks,
its utility futures and every request's ``RequestOutputCollector`` belong to the
loop that first ran them (the *owner* loop). :func:`engine_client_proxy` returns
an object that vLLM's serving layer accepts as its engine client
(``isinstance(p, EngineClient)`` holds) and that never touches that loop state
from a foreign thread:

* async members run on the owner loop (``loopbridge.proxy``);
* ``generate`` and ``encode`` run on the owner loop and stream their outputs
  through loopbridge's batched, back-pressured streams; closing or cancelling
  the consumer closes the generator on the owner loop, where vLLM aborts the
  request itself, exactly once;
* setup data (``vllm_config``, ``model_config``, ``renderer``, ...) is read
  directly, because the serving code needs it on its own thread;
* health members (``errored``, ``dead_error``, ``is_running``,
  ``is_stopped``, and the ``check_health`` coroutine behind ``/health``) are
  read directly and never wait for the owner loop;
* every other sync member is either declared thread-safe below, with the
  reason, or refused with :class:`loopbridge.LoopAffinityError`;
* an async or streamed member called from a thread with no running loop (and
  outside trio) is refused at once with :class:`OffLoopCall`, naming
  ``blocking(proxy)``: a pause, a weight update or a ``collective_rpc`` that
  would build a coroutine nobody runs cannot silently not happen;
* once :func:`shutdown_engine` has begun, every request still streaming ends at
  once with :class:`EngineShutDown` (an error event on an HTTP stream), and
  every later call through the proxy raises it.

The member list is not written by hand. :func:`surface` derives it from the
installed vLLM (the ``EngineClient`` protocol, ``AsyncLLM`` and the instance's
own attributes) and :data:`RULES` / :data:`KIND_RULES` classify each member;
a member that no rule covers makes :func:`engine_client_proxy` fail at start-up
with :class:`UnclassifiedMemberError` instead of failing requests later.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loopbridge import LoopAffinityError, is_proxy, proxy, unwrap
from loopbridge_adapters.owner import Adoption
from loopbridge_adapters.surface import (
    Member,
    MemberTable,
    Policy,
    Rule,
    UnclassifiedMemberError,
    collect,
)
from loopbridge_vllm._vllm_releases import UntestedReleaseWarning, untested_release_note

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

__all__ = [
    "KIND_RULES",
    "RULES",
    "EngineShutDown",
    "OffLoopCall",
    "Member",
    "Policy",
    "Rule",
    "UnclassifiedMemberError",
    "UnsupportedEngineConfig",
    "adopt_engine",
    "bind_owner_loop",
    "classify_surface",
    "engine_client_proxy",
    "engine_shut_down",
    "is_engine_client_proxy",
    "shutdown_engine",
    "surface",
]


_STABLE_CONFIG = (
    "a config object set in __init__ and never replaced; vLLM's serving code reads "
    "it on the HTTP thread"
)

#: Per-member rules: every sync member and data attribute needs a human decision.
RULES: Mapping[str, Rule] = {
    # -- setup data --------------------------------------------------------
    "vllm_config": Rule(Policy.STABLE, _STABLE_CONFIG),
    "model_config": Rule(Policy.STABLE, _STABLE_CONFIG),
    "scheduler_config": Rule(Policy.STABLE, _STABLE_CONFIG),
    "observability_config": Rule(Policy.STABLE, _STABLE_CONFIG),
    "log_requests": Rule(Policy.STABLE, "a bool set in __init__"),
    "log_stats": Rule(Policy.STABLE, "a bool set in __init__"),
    "renderer": Rule(
        Policy.STABLE,
        "set once in __init__; the serving layer renders and tokenizes on the HTTP "
        "thread by design, and the renderer runs that work in its own thread pool",
    ),
    "input_processor": Rule(
        Policy.STABLE,
        "set once in __init__; serving code only reads its configuration (beam "
        "search, streaming input); processing for a request runs in add_request on "
        "the owner loop",
    ),
    "tokenizer": Rule(Policy.STABLE, "property returning renderer.tokenizer (stable)"),
    # -- health -------------------------------------------------------------
    "errored": Rule(
        Policy.HEALTH,
        "reads engine_core.resources.engine_dead and output_handler.done(): plain "
        "reads, atomic under the GIL; serving code reads it before every response, "
        "so it must not wait for the owner loop",
    ),
    "is_running": Rule(Policy.HEALTH, "output_handler.done(): a plain read"),
    "is_stopped": Rule(Policy.HEALTH, "equals errored"),
    "dead_error": Rule(Policy.HEALTH, "builds a new EngineDeadError; touches no state"),
    "should_keep_api_server_alive": Rule(Policy.HEALTH, "reads a flag (elastic EP)"),
    "check_health": Rule(
        Policy.HEALTH,
        "a coroutine that only reads errored and dead_error; /health awaits it, so it "
        "runs on the caller's loop: a busy or blocked owner loop must not make a "
        "healthy engine look dead, nor delay a 503 for a dead one",
    ),
    # -- sync members that are safe from any thread ---------------------------
    "shutdown": Rule(
        Policy.THREADSAFE,
        "tears down through cancel_task_threadsafe and call_soon_threadsafe; vLLM's "
        "own launcher calls it from an executor thread",
    ),
    "check_admission": Rule(
        Policy.THREADSAFE,
        "called by the serving layer before every response, so it cannot wait for the "
        "owner loop; with max_num_queued_reqs it reads len() of a dict (atomic). With "
        "max_num_queued_tokens it would iterate owner-loop state, so "
        "engine_client_proxy refuses that configuration",
    ),
    "get_num_unfinished_requests": Rule(
        Policy.THREADSAFE, "len() of the output processor's dict: atomic under the GIL"
    ),
    "get_tokenizer": Rule(Policy.THREADSAFE, "returns the renderer's tokenizer (stable)"),
    "get_kv_event_sources": Rule(Policy.THREADSAFE, "reads static configuration"),
    # -- sync members and state that belong to the owner loop -----------------
    "get_num_queued_tokens": Rule(
        Policy.REFUSE,
        "iterates the output processor's request dict, which the owner loop mutates: "
        "off that loop it can raise 'dictionary changed size during iteration'",
    ),
    "engine_core": Rule(
        Policy.REFUSE, "the ZMQ client: its sockets, queue and futures belong to the owner loop"
    ),
    "output_processor": Rule(
        Policy.REFUSE, "per-request state and collectors, mutated by the output handler"
    ),
    "output_handler": Rule(Policy.REFUSE, "the owner loop's output-handler task"),
    "logger_manager": Rule(Policy.REFUSE, "stat loggers updated by the output handler"),
    "admission_stats": Rule(Policy.REFUSE, "shared counters updated by the output processor"),
    "profiler": Rule(Policy.REFUSE, "profiler session state, changed by start/stop_profile"),
    # -- async members named explicitly (also covered by KIND_RULES) ----------
    "generate": Rule(
        Policy.STREAM,
        "add_request, the collector and its event live on the owner loop; outputs "
        "stream back batched with back-pressure; closing the stream closes the "
        "generator there, and vLLM aborts the request once",
    ),
    "encode": Rule(Policy.STREAM, "as generate, for pooling models"),
    "abort": Rule(Policy.MARSHAL, "mutates the output processor and sends on the ZMQ socket"),
    "collective_rpc": Rule(
        Policy.MARSHAL, "a utility call: its future is resolved by the owner loop's socket task"
    ),
    "pause_generation": Rule(Policy.MARSHAL, "a utility call on the owner loop"),
    "resume_generation": Rule(Policy.MARSHAL, "a utility call on the owner loop"),
}

#: Rules by member kind, for members without a per-member rule.
KIND_RULES: Mapping[str, Rule] = {
    "async": Rule(
        Policy.MARSHAL,
        "coroutines may touch the ZMQ client, utility futures and locks that belong "
        "to the owner loop, so each call runs there",
    ),
    "asyncgen": Rule(Policy.STREAM, "an async generator runs on the owner loop and streams back"),
    "class-level": Rule(
        Policy.CLASS_LEVEL,
        "classmethods, staticmethods and class data hold no per-instance loop state",
    ),
    "private": Rule(
        Policy.REFUSE,
        "private sync members and attributes are engine internals; serving code does "
        "not use them and they may touch owner-loop state",
    ),
}


class UnsupportedEngineConfig(LoopAffinityError):
    """An engine option makes a sync member unsafe off the owner loop."""


class OffLoopCall(LoopAffinityError):
    """An engine proxy's async or streamed member was called where nothing can run it.

    From a thread with no running event loop (and outside trio), the call would
    build a coroutine or stream that nobody awaits: a pause, a weight update or
    a ``collective_rpc`` would silently not happen. ``blocking(proxy)`` is the
    face for plain threads.
    """


class EngineShutDown(LoopAffinityError):
    """The engine was shut down (:func:`shutdown_engine`): it serves nothing more.

    Requests still streaming when the shutdown began end with it, and every later
    call through the engine's proxy raises it. Build a new engine to go on.
    """


def _shut_down_message(what: str) -> str:
    return (
        f"{what}: the engine was shut down (shutdown_engine), so it serves nothing "
        "more; build a new engine (and its server) to go on"
    )


#: Engines whose shutdown has begun (shutdown_engine); read on every proxy call.
_shut_down: weakref.WeakSet[Any] = weakref.WeakSet()
_shut_down_lock = threading.Lock()


def engine_shut_down(engine: Any) -> bool:
    """Whether :func:`shutdown_engine` has begun for ``engine`` (or its proxy)."""
    return unwrap(engine) in _shut_down


def _in_trio() -> bool:
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


def _off_loop(name: str) -> OffLoopCall:
    return OffLoopCall(
        f"engine proxy .{name}() was called from thread {threading.current_thread().name!r}, "
        "which runs no event loop, so nothing would run it (a pause or weight update "
        f"would silently not happen): call loopbridge.blocking(proxy).{name}(...) there, "
        f"or `await proxy.{name}(...)` inside a coroutine"
    )


def _checked(name: str, base: Callable[..., Any]) -> Callable[..., Any]:
    """``base`` (a marshalled or streamed member of the proxy class), refused at once
    off any loop and after the engine's shutdown."""

    def member(self: Any, *args: Any, **kwargs: Any) -> Any:
        if unwrap(self) in _shut_down:
            raise EngineShutDown(_shut_down_message(f"engine proxy .{name}()"))
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if not _in_trio():
                raise _off_loop(name) from None
        return base(self, *args, **kwargs)

    member.__name__ = name
    # The blocking face runs vLLM's method, as for the member this wraps.
    member.__wrapped__ = getattr(base, "__wrapped__", base)  # type: ignore[attr-defined]
    return member


_checked_classes: dict[type, type] = {}
_checked_lock = threading.Lock()


def _checked_class(pcls: type, engine: Any) -> type:
    """The proxy class with every marshalled and streamed member checked (cached)."""
    with _checked_lock:
        cls = _checked_classes.get(pcls)
        if cls is not None:
            return cls
        ns: dict[str, Any] = {"__slots__": ()}
        for name, (_, rule) in classify_surface(type(engine), engine).items():
            if rule is None or rule.policy not in (Policy.MARSHAL, Policy.STREAM):
                continue
            base = getattr(pcls, name, None)
            if callable(base):
                ns[name] = _checked(name, base)
        cls = type(pcls)(pcls.__name__, (pcls,), ns)
        cls.__module__ = pcls.__module__
        cls.__qualname__ = pcls.__qualname__
        _checked_classes[pcls] = cls
        return cls


def surface(engine_cls: type | None = None, instance: object | None = None) -> dict[str, Member]:
    """Every member of the installed engine surface, with its kind.

    Sources: the ``EngineClient`` protocol (its methods, properties and annotated
    attributes), the engine class (``AsyncLLM`` by default, all bases), and, if
    given, the instance's own attributes. Dunder members are left out: the proxy
    never forwards them.
    """
    from vllm.engine.protocol import EngineClient

    if engine_cls is None:
        from vllm.v1.engine.async_llm import AsyncLLM

        engine_cls = AsyncLLM
    return collect((engine_cls, EngineClient), annotated=(EngineClient,), instance=instance)


_TABLE = MemberTable(RULES, KIND_RULES, "loopbridge_vllm.engine.RULES")


def classify_surface(
    engine_cls: type | None = None, instance: object | None = None
) -> dict[str, tuple[Member, Rule | None]]:
    """Each member of :func:`surface` with its rule (``None``: unclassified)."""
    return _TABLE.classify(surface(engine_cls, instance))


def _handler_loop(engine: Any) -> asyncio.AbstractEventLoop | None:
    """The loop the engine's background tasks run (or ran) on, if any started.

    Those are the output handler and the ZMQ client's socket reader; both
    start lazily on the first loop that needs them, and never move.
    """
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    for task in (
        getattr(engine, "output_handler", None),
        getattr(resources, "output_queue_task", None),
        getattr(resources, "stats_update_task", None),
    ):
        if isinstance(task, asyncio.Task):
            return task.get_loop()
    return None


def _check_config(engine: Any) -> None:
    scheduler = getattr(engine, "scheduler_config", None)
    if getattr(scheduler, "max_num_queued_tokens", None) is not None:
        raise UnsupportedEngineConfig(
            "max_num_queued_tokens is set: AsyncLLM.check_admission then iterates the "
            "output processor's per-request state, which only the owner loop may touch, "
            "and the serving layer calls it from the HTTP thread before every response. "
            "Use max_num_queued_reqs (a plain count) instead."
        )


_ADOPTION = Adoption(
    noun="engine",
    handler="output handler",
    moving="an AsyncLLM cannot change loops once it has started",
    declarers="adopt_engine()/engine_client_proxy()",
    handler_loop=_handler_loop,
    declarations=lambda engine: _TABLE.declarations(surface(type(engine), engine)),
)


def adopt_engine(engine: AsyncLLM, loop: asyncio.AbstractEventLoop | None = None) -> AsyncLLM:
    """Declare ``engine``'s owner loop and its member table (once per engine).

    ``loop`` defaults to the loop its output handler already runs on, else the
    running loop. With neither (an engine built in a plain thread, as a Ray
    worker's ``__init__`` may do), the engine has no owner until
    :func:`bind_owner_loop` records one, typically at worker initialisation.
    Calling it again for an engine already declared is a no-op (with the same
    loop) or an error (with another one).
    """
    return _ADOPTION.adopt(engine, loop)


def bind_owner_loop(engine: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Record (or move) the owner loop of an engine that has not started yet.

    Call it on the loop that will own the engine (``loop`` defaults to the
    running one), e.g. in a Ray actor's async ``post_init``. The engine's output
    handler then starts on that loop with the first request, whoever sends it.
    Moving an engine whose output handler already runs elsewhere is refused.
    """
    _ADOPTION.bind_owner_loop(engine, loop)


def _warn_if_untested() -> None:
    note = untested_release_note()
    if note is not None:
        # One line; the surface check below still refuses any unclassified member.
        warnings.warn(note, UntestedReleaseWarning, stacklevel=3)


def engine_client_proxy(
    engine: AsyncLLM,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    stream_window: int = 32,
    cancel_grace: float = 5.0,
) -> AsyncLLM:
    """An engine client for vLLM's serving layer that is safe on any thread or loop.

    The result is an instance of a generated subclass of ``type(engine)``, so
    vLLM's type checks accept it. ``loop`` names the owner loop if the engine
    has not been declared yet (see :func:`adopt_engine`). ``stream_window`` is
    how many outputs of one request may be buffered ahead of a slow consumer
    (vLLM's own collector merges deltas beyond that); ``cancel_grace`` bounds
    how long a cancelled caller waits for the owner side to finish the abort.

    Raises :class:`UnclassifiedMemberError` if the installed vLLM has a member
    no rule covers, and :class:`UnsupportedEngineConfig` for options that make
    a sync member unsafe off the owner loop.

    Its async and streamed members (``pause_generation``, ``collective_rpc``,
    ``generate``, ...) raise :class:`OffLoopCall` when called from a thread that
    runs no event loop: use ``loopbridge.blocking(proxy)`` there. After
    :func:`shutdown_engine` they raise :class:`EngineShutDown`.
    """
    if is_engine_client_proxy(engine):
        return engine
    _warn_if_untested()
    _check_config(engine)
    adopt_engine(engine, loop)
    # Re-derive the table for this instance: attributes added since adoption
    # (vLLM sets some lazily) must be classified too.
    _TABLE.declarations(surface(type(engine), engine))
    p = proxy(engine, stream_window=stream_window, cancel_grace=cancel_grace)
    # Same slots, one more layer of members: each async or streamed member is
    # refused at once where nothing could run it, and after the shutdown.
    object.__setattr__(p, "__class__", _checked_class(type(p), engine))
    return p


def shutdown_engine(engine: Any, timeout: float = 10.0) -> None:
    """Shut an engine down cleanly from any thread (also through a proxy).

    ``AsyncLLM.shutdown`` stops the EngineCore first and cancels the output
    handler afterwards; when the owner loop keeps running meanwhile (it always
    does in a threaded set-up), the handler can see the dying EngineCore first
    and report it as an engine failure. So the handler is stopped on the owner
    loop first (waiting at most ``timeout`` seconds), then ``shutdown`` runs.

    From its first step the engine counts as shut down (:func:`engine_shut_down`):
    every request still in flight ends at once with :class:`EngineShutDown` (a
    server streaming it sends an error event saying so, and stops by itself),
    and every later call through the engine's proxy raises it.
    """
    engine = unwrap(engine)
    with _shut_down_lock:
        _shut_down.add(engine)
    task = getattr(engine, "output_handler", None)
    if isinstance(task, asyncio.Task) and not task.done():
        loop = task.get_loop()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task.cancel()  # delivered before the loop runs anything else
            _end_in_flight(engine)
        elif not loop.is_closed():

            async def stop_handler() -> None:
                task.cancel()
                await asyncio.wait([task])
                _end_in_flight(engine)

            try:
                asyncio.run_coroutine_threadsafe(stop_handler(), loop).result(timeout)
            except (RuntimeError, TimeoutError):
                pass  # loop stopped meanwhile: shutdown() below still cleans up
    engine.shutdown()


def _end_in_flight(engine: Any) -> None:
    """On the owner loop, with the output handler stopped: every request still in
    flight ends with the shutdown's error (nothing else would ever end it)."""
    processor = getattr(engine, "output_processor", None)
    if processor is not None and getattr(processor, "request_states", None):
        processor.propagate_error(_stream_error())


_stream_error_class: list[type[BaseException]] = []


def _stream_error() -> BaseException:
    """:class:`EngineShutDown` as vLLM's ``generate`` re-raises it unchanged and its
    serving layer reports it to the client: a subclass of its ``EngineDeadError``."""
    if not _stream_error_class:
        from vllm.v1.engine.exceptions import EngineDeadError

        message = _shut_down_message("the request was cut short")

        class _ShutDownInFlight(EngineDeadError, EngineShutDown):
            # What vLLM's error response sends to the client (0.33+; str() before).
            CLIENT_MESSAGE = message

            def __init__(self) -> None:
                Exception.__init__(self, message)
                self.__suppress_context__ = True

        _ShutDownInFlight.__name__ = _ShutDownInFlight.__qualname__ = "EngineShutDown"
        _stream_error_class.append(_ShutDownInFlight)
    return _stream_error_class[0]()


def is_engine_client_proxy(obj: object) -> bool:
    """True for objects made by :func:`engine_client_proxy` (or ``loopbridge.proxy``)."""
    return is_proxy(obj)
