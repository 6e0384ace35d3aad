"""The patches: what the sanitizer hooks while it is on, and how it judges a call.

Ownership rule. Every checked object has an owner loop: a future's or task's
loop, a primitive's bound loop (asyncio binds it when the first waiter is
created), or, for a primitive that never had a waiter, the loop it was first
used on. A call is a misuse when

* the owner loop is running in another thread (``wrong-thread`` when the
  caller runs no loop, ``wrong-loop`` when it runs a different one), or
* the owner loop is idle and the caller runs a *different* loop: it would
  wake, or schedule onto, a loop other than its own (``wrong-loop``).

Calls from a thread with no running loop while the owner is idle are allowed:
that is set-up and tear-down code. Loop scheduling calls (``call_soon``...)
follow only the first rule, like asyncio's own debug check.

Where it fails. Under ``raise`` the error is raised in the offending call, with
one exception: a *wake* (``Event.set``, ``Queue.put_nowait``, a future's
``set_result``/``set_exception``) made on one running loop for waiters of
another loop, running in another thread. That waker is a loop's own machinery
(an engine's output handler serving many requests), and the misuse is the
waiter's: it waits on an object that another loop drives. Raising there would
kill the machinery and leave the waiter hanging, so the report is logged and
recorded there without raising, the wake is not done, and each waiter fails
with the :class:`SanitizerError` on its own loop (with no waiter left, the wake
goes ahead, reported and unraised).

Pure-Python primitives (Event, Lock, Semaphore, Condition, Queue) and the
Python event loop are patched method by method. ``asyncio.Future`` and
``asyncio.Task`` are C types whose methods cannot be replaced, so while the
sanitizer is on asyncio's factories (``asyncio.Future``, ``asyncio.Task`` and
the module globals the loop uses) produce Python subclasses that check.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.futures
import asyncio.mixins
import asyncio.selector_events
import asyncio.tasks
import functools
import importlib.util
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from types import ModuleType, TracebackType
from typing import Any, NamedTuple, Protocol

from .._compat import thread_id_of
from .._labels import loop_label, thread_name
from . import _sites
from ._report import Kind, SanitizerError, SanitizerReport, emitter
from ._sites import Site

# Read on every instrumented call; written under the package lock (one module
# global: a reader sees the old value or the new, with or without the GIL).
_active = False

_get_running_loop = asyncio.events._get_running_loop
_get_ident = threading.get_ident

_ORIG_FUTURE: type[asyncio.Future[object]] = asyncio.futures.Future
_ORIG_TASK: type[asyncio.Task[object]] = asyncio.tasks.Task

_BIND = "_loopbridge_bind"
_THREAD = "_loopbridge_thread_id"


def set_active(on: bool) -> None:
    global _active
    _active = on


class _Bind(NamedTuple):
    loop: asyncio.AbstractEventLoop
    site: Site
    how: str


class _Primitive(Protocol):
    """An asyncio primitive (Event, Lock, Semaphore, Condition, Queue): bound to
    a loop by its first waiter, ``None`` before that."""

    @property
    def _loop(self) -> asyncio.AbstractEventLoop | None: ...


class _OnLoop(Protocol):
    """A future or task: bound to its loop from birth."""

    @property
    def _loop(self) -> asyncio.AbstractEventLoop: ...

    def done(self) -> bool: ...


#: A patched method, or what replaces it.
_F = Callable[..., object]


# --- suppression of nested reports ------------------------------------------
# Event.set() wakes a waiter future, whose set_result() schedules through
# loop.call_soon(): one misuse, three checks. The outermost reports it.

_tls = threading.local()


class _Nested:
    def __enter__(self) -> None:
        _tls.depth = getattr(_tls, "depth", 0) + 1

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        _tls.depth -= 1


_nested = _Nested()


# --- judging -----------------------------------------------------------------


def _loop_thread_id(loop: asyncio.AbstractEventLoop) -> int | None:
    tid = thread_id_of(loop)
    if tid is None:  # uvloop: recorded by our run_forever wrapper
        tid = getattr(loop, _THREAD, None)
    return tid


def _running_elsewhere(loop: asyncio.AbstractEventLoop) -> bool:
    if not loop.is_running():
        return False
    tid = _loop_thread_id(loop)
    # uvloop does not expose its thread; a running loop is always the running
    # loop of its own thread, and the caller already checked it is not ours.
    return tid is None or tid != _get_ident()


def _judge(owner: asyncio.AbstractEventLoop, cur: asyncio.AbstractEventLoop | None) -> Kind | None:
    if _running_elsewhere(owner):
        return "wrong-thread" if cur is None else "wrong-loop"
    if cur is not None:
        return "wrong-loop"
    return None


def _thread_of(loop: asyncio.AbstractEventLoop) -> str | None:
    tid = _loop_thread_id(loop)
    return None if tid is None else thread_name(tid)


def _describe_waiters(*queues: object) -> tuple[str, ...]:
    out: list[str] = []
    for q in queues:
        if not q:
            continue
        for _ in range(3):  # the owner thread may be mutating the deque right now
            try:
                items = list(q)  # type: ignore[call-overload]
                break
            except RuntimeError:
                continue
        else:
            out.append("(waiters changed while being read)")
            continue
        for w in items:
            site = getattr(w, "_lb_site", None)
            loop = getattr(w, "_loop", None)
            text = f"waiter of {loop_label(loop)}" if loop is not None else "waiter"
            if site is not None:
                text += f" created at {site}"
            out.append(text)
    return tuple(out)


#: Wakes whose waiters fail instead of the waker (see the module docstring).
_WAKES = frozenset(
    {
        "asyncio.Event.set",
        "asyncio.Queue.put_nowait",
        "asyncio.Future.set_result",
        "asyncio.Future.set_exception",
    }
)

#: What a check returns when the operation must not run (its waiters failed).
_SKIP = object()


def _fail(fut: asyncio.Future[object], error: BaseException) -> None:
    # On the waiter's own loop.
    if not fut.done():
        fut.set_exception(error)


def _contained(
    report: SanitizerReport, owner: asyncio.AbstractEventLoop, futures: list[Any]
) -> object:
    """A wake for waiters of ``owner`` (running elsewhere): under "raise", fail those
    waiters there and skip the wake (:data:`_SKIP`), or, with none waiting, let the
    wake go ahead unraised; otherwise report as usual."""
    if not emitter.contain(report) or not futures:
        return True  # nobody waits: the wake goes ahead, reported, never raised here
    for fut in futures:
        try:
            owner.call_soon_threadsafe(_fail, fut, SanitizerError(report))
        except RuntimeError:  # closed meanwhile: nothing waits any more
            pass
    return _SKIP


def _violation(
    op: str,
    kind: Kind,
    owner: asyncio.AbstractEventLoop,
    cur: asyncio.AbstractEventLoop | None,
    subject: str,
    bind: Site | None,
    how: str,
    waiters: tuple[str, ...] = (),
    wake: list[Any] | None = None,
) -> object:
    """Report; return True if the operation should go ahead (warn/log), or
    :data:`_SKIP` if its waiters (``wake``, futures of ``owner``) were failed."""
    if getattr(_tls, "depth", 0):
        return True
    report = SanitizerReport(
        operation=op,
        kind=kind,
        subject=subject,
        call_stack=_sites.capture_stack(),
        call_loop=f"running {loop_label(cur)}" if cur is not None else "no running loop",
        owner_loop=loop_label(owner),
        owner_thread=_thread_of(owner) if owner.is_running() else None,
        bind=bind,
        bind_how=how,
        waiters=waiters,
    )
    if op in _WAKES and cur is not None and _running_elsewhere(owner):
        return _contained(report, owner, wake or [])
    emitter.emit(report)  # raises under the "raise" policy
    return True


def _subject(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}@{id(obj):#x}"


def _check_primitive(prim: _Primitive, op: str) -> object:
    cur = _get_running_loop()
    owner: asyncio.AbstractEventLoop | None = prim._loop
    bind: _Bind | None = getattr(prim, _BIND, None)
    if owner is None:
        # Never had a waiter: asyncio would let it move between loops, so we
        # only object to use while the loop it was last used on runs elsewhere.
        if bind is not None:
            if bind.loop is cur:
                return False
            if _running_elsewhere(bind.loop):
                kind: Kind = "wrong-thread" if cur is None else "wrong-loop"
                return _violation(op, kind, bind.loop, cur, _subject(prim), bind.site, bind.how)
        if cur is not None:
            try:
                setattr(prim, _BIND, _Bind(cur, _sites.capture(), "first used on this loop"))
            except AttributeError:  # a subclass with __slots__
                pass
        return False
    if owner is cur:
        return False
    verdict = _judge(owner, cur)
    if verdict is None:
        return False
    site = bind.site if bind is not None and bind.loop is owner else None
    how = bind.how if site is not None and bind is not None else ""
    queues = (
        getattr(prim, "_waiters", None),
        getattr(prim, "_getters", None),
        getattr(prim, "_putters", None),
    )
    waiters = _describe_waiters(*queues)
    wake = _waiting(getattr(prim, "_waiters", None) or getattr(prim, "_getters", None))
    return _violation(op, verdict, owner, cur, _subject(prim), site, how, waiters, wake)


def _waiting(queue: object) -> list[Any]:
    """The futures still waiting in ``queue`` (a primitive's deque), read once."""
    for _ in range(3):  # the owner thread may be mutating the deque right now
        try:
            return [w for w in list(queue or ()) if not w.done()]  # type: ignore[call-overload]
        except RuntimeError:
            continue
    return []


def _check_future(fut: _OnLoop, op: str) -> object:
    owner: asyncio.AbstractEventLoop = fut._loop
    cur = _get_running_loop()
    verdict = _judge(owner, cur)
    if verdict is None:
        return False
    site: Site | None = getattr(fut, "_lb_site", None)
    return _violation(
        op,
        verdict,
        owner,
        cur,
        _subject(fut),
        site,
        "created" if site is not None else "",
        wake=[fut] if not fut.done() else None,
    )


def _check_loop(loop: asyncio.AbstractEventLoop, op: str) -> object:
    if not _running_elsewhere(loop):
        return False
    cur = _get_running_loop()
    return _violation(
        op, "wrong-thread" if cur is None else "wrong-loop", loop, cur, loop_label(loop), None, ""
    )


# --- Future and Task subclasses ----------------------------------------------


class _Meta(type):
    """Keeps ``isinstance(x, asyncio.Future)`` true for futures created before
    the swap or by C code (``gather``), while ``asyncio.Future`` is ours."""

    _lb_base: type

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._lb_base)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._lb_base)


def _checked(base: type, name: str) -> _F:
    """``base.name`` with the ownership check in front (the Future/Task methods
    that wake or schedule onto the object's loop)."""
    orig: _F = base.__dict__[name]
    op = f"asyncio.{base.__name__}.{name}"

    @functools.wraps(orig)
    def method(self: _OnLoop, *args: object, **kwargs: object) -> object:
        if _active and _get_running_loop() is not self._loop and (go := _check_future(self, op)):
            if go is _SKIP:
                return None
            with _nested:
                return orig(self, *args, **kwargs)
        return orig(self, *args, **kwargs)

    return method


class SanFuture(_ORIG_FUTURE, metaclass=_Meta):  # type: ignore[misc,valid-type]
    _lb_base = _ORIG_FUTURE
    __slots__ = ("_lb_site",)

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        _ORIG_FUTURE.__init__(self, loop=loop)
        self._lb_site: Site | None = _sites.capture() if _active else None

    set_result = _checked(_ORIG_FUTURE, "set_result")
    set_exception = _checked(_ORIG_FUTURE, "set_exception")
    cancel = _checked(_ORIG_FUTURE, "cancel")
    add_done_callback = _checked(_ORIG_FUTURE, "add_done_callback")


class SanTask(_ORIG_TASK, metaclass=_Meta):  # type: ignore[misc,valid-type]
    _lb_base = _ORIG_TASK
    __slots__ = ("_lb_site",)

    def __init__(
        self,
        coro: Coroutine[object, object, object],
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        **kwargs: Any,  # Task's own keywords (name, context, eager_start), as this Python has them
    ) -> None:
        # Before the base __init__: on 3.12+ an eager task may start running there.
        self._lb_site: Site | None = _sites.capture() if _active else None
        _ORIG_TASK.__init__(self, coro, loop=loop, **kwargs)

    cancel = _checked(_ORIG_TASK, "cancel")
    add_done_callback = _checked(_ORIG_TASK, "add_done_callback")


# --- wrappers ------------------------------------------------------------------


def _owner_of(prim: _Primitive) -> asyncio.AbstractEventLoop | None:
    owner: asyncio.AbstractEventLoop | None = prim._loop
    if owner is None:
        bind: _Bind | None = getattr(prim, _BIND, None)
        if bind is not None:
            owner = bind.loop
    return owner


async def _checked_run(
    orig: Callable[..., Awaitable[object]],
    op: str,
    prim: _Primitive,
    args: tuple[object, ...],
    kwargs: dict[str, object],
) -> object:
    _check_primitive(prim, op)
    return await orig(prim, *args, **kwargs)


def _primitive_wrapper(orig: _F, op: str) -> _F:
    if inspect.iscoroutinefunction(orig):
        # acquire(), wait(), get()...: the check belongs where the coroutine
        # runs, not where it is created (run_coroutine_threadsafe(q.get(),
        # loop) creates it in a foreign thread, correctly). When the caller
        # already runs on the owner loop, hand back the original coroutine;
        # otherwise a coroutine that checks once it runs.
        @functools.wraps(orig)
        def coroutine_wrapper(self: _Primitive, *args: object, **kwargs: object) -> object:
            if _active:
                owner = _owner_of(self)
                if owner is None or owner is not _get_running_loop():
                    return _checked_run(orig, op, self, args, kwargs)
            return orig(self, *args, **kwargs)

        if hasattr(inspect, "markcoroutinefunction"):
            inspect.markcoroutinefunction(coroutine_wrapper)
        return coroutine_wrapper

    if list(inspect.signature(orig).parameters) == ["self"]:
        # set(), clear(), release()...: skip the *args/**kwargs packing.
        @functools.wraps(orig)
        def no_arg_wrapper(self: _Primitive) -> object:
            if _active:
                owner = self._loop
                if owner is None:
                    bind = getattr(self, _BIND, None)
                    if bind is not None:
                        owner = bind[0]
                if (owner is None or owner is not _get_running_loop()) and (
                    go := _check_primitive(self, op)
                ):
                    if go is _SKIP:
                        return None
                    with _nested:
                        return orig(self)
            return orig(self)

        return no_arg_wrapper

    @functools.wraps(orig)
    def wrapper(self: _Primitive, *args: object, **kwargs: object) -> object:
        if _active:
            owner = self._loop
            if owner is None:  # inlined _owner_of: this is the hot path
                bind = getattr(self, _BIND, None)
                if bind is not None:
                    owner = bind[0]
            if (owner is None or owner is not _get_running_loop()) and (
                go := _check_primitive(self, op)
            ):
                if go is _SKIP:
                    return None
                with _nested:
                    return orig(self, *args, **kwargs)
        return orig(self, *args, **kwargs)

    return wrapper


def _loop_wrapper(orig: _F, op: str) -> _F:
    @functools.wraps(orig)
    def wrapper(self: asyncio.AbstractEventLoop, *args: object, **kwargs: object) -> object:
        if _active and _get_running_loop() is not self and _check_loop(self, op):
            with _nested:
                return orig(self, *args, **kwargs)
        return orig(self, *args, **kwargs)

    return wrapper


def _get_loop_wrapper(orig: Callable[[_Primitive], asyncio.AbstractEventLoop]) -> _F:
    @functools.wraps(orig)
    def _get_loop(self: _Primitive) -> asyncio.AbstractEventLoop:
        if _active and self._loop is None:
            loop: asyncio.AbstractEventLoop = orig(self)
            if getattr(self, "_loop", None) is loop:  # it bound just now
                bind: _Bind | None = getattr(self, _BIND, None)
                if bind is None or bind.loop is not loop:
                    try:
                        setattr(self, _BIND, _Bind(loop, _sites.capture(), "first waiter"))
                    except AttributeError:
                        pass
            return loop
        return orig(self)

    return _get_loop


def _uvloop_create_future(orig: _F) -> _F:
    @functools.wraps(orig)
    def create_future(self: asyncio.AbstractEventLoop) -> object:
        if not _active:
            return orig(self)
        if _get_running_loop() is not self and _check_loop(self, "loop.create_future"):
            with _nested:
                return SanFuture(loop=self)
        return SanFuture(loop=self)

    return create_future


def _uvloop_create_task(orig: _F) -> _F:
    @functools.wraps(orig)
    def create_task(
        self: asyncio.AbstractEventLoop, coro: Coroutine[object, object, object], **kwargs: object
    ) -> object:
        if not _active:
            return orig(self, coro, **kwargs)
        if _get_running_loop() is not self and _check_loop(self, "loop.create_task"):
            with _nested:
                return _uvloop_make_task(self, orig, coro, kwargs)
        return _uvloop_make_task(self, orig, coro, kwargs)

    return create_task


def _uvloop_make_task(
    loop: asyncio.AbstractEventLoop,
    orig: _F,
    coro: Coroutine[object, object, object],
    kwargs: dict[str, object],
) -> object:
    if loop.get_task_factory() is not None:
        return orig(loop, coro, **kwargs)
    name = kwargs.pop("name", None)
    task = SanTask(coro, loop=loop, **kwargs)
    if name is not None:
        task.set_name(name)
    return task


def _uvloop_run_forever(orig: _F) -> _F:
    # uvloop keeps its thread to itself; remember it for reports.
    @functools.wraps(orig)
    def run_forever(self: asyncio.AbstractEventLoop) -> object:
        setattr(self, _THREAD, _get_ident())
        try:
            return orig(self)
        finally:
            setattr(self, _THREAD, None)

    return run_forever


# --- the patch table -----------------------------------------------------------

_MISSING = object()
_applied: list[tuple[object, str, object]] = []

_PRIMITIVE_METHODS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (asyncio.Event, ("set", "clear", "wait")),
    (asyncio.Lock, ("acquire", "release")),
    (asyncio.Semaphore, ("acquire", "release")),
    (asyncio.Condition, ("notify", "notify_all", "wait")),
    (asyncio.Queue, ("put", "put_nowait", "get", "get_nowait", "task_done", "join")),
)

LOOP_METHODS = ("call_soon", "call_later", "call_at", "create_task", "create_future", "stop")
_SELECTOR_METHODS = ("add_reader", "add_writer", "remove_reader", "remove_writer")


def _set(owner: object, name: str, value: object) -> None:
    space = owner.__dict__ if isinstance(owner, (type, ModuleType)) else {}
    _applied.append((owner, name, space.get(name, _MISSING)))
    setattr(owner, name, value)


def _uvloop() -> ModuleType | None:
    if "uvloop" in sys.modules:
        return sys.modules["uvloop"]
    if importlib.util.find_spec("uvloop") is None:
        return None
    import uvloop

    return uvloop


def patch() -> None:
    """Install every hook. Caller holds the package lock; not re-entrant."""
    if _applied:
        return
    for cls, names in _PRIMITIVE_METHODS:
        for name in names:
            op = f"asyncio.{cls.__name__}.{name}"
            _set(cls, name, _primitive_wrapper(cls.__dict__[name], op))
    mixin = asyncio.mixins._LoopBoundMixin
    _set(mixin, "_get_loop", _get_loop_wrapper(mixin.__dict__["_get_loop"]))

    base = asyncio.base_events.BaseEventLoop
    for name in LOOP_METHODS:
        _set(base, name, _loop_wrapper(base.__dict__[name], f"loop.{name}"))
    sel = asyncio.selector_events.BaseSelectorEventLoop
    for name in _SELECTOR_METHODS:
        _set(sel, name, _loop_wrapper(sel.__dict__[name], f"loop.{name}"))

    for module in (asyncio, asyncio.futures):
        _set(module, "Future", SanFuture)
    for module in (asyncio, asyncio.tasks):
        _set(module, "Task", SanTask)

    uvloop = _uvloop()
    if uvloop is not None:
        # uvloop.Loop is a Python subclass of the Cython loop: methods set on it
        # shadow the C ones. uvloop builds its futures and tasks from classes it
        # captured at import, so create_future/create_task build ours instead.
        cls = uvloop.Loop
        for name in LOOP_METHODS:
            orig = getattr(cls, name)
            if name == "create_future":
                _set(cls, name, _uvloop_create_future(orig))
            elif name == "create_task":
                _set(cls, name, _uvloop_create_task(orig))
            else:
                _set(cls, name, _loop_wrapper(orig, f"loop.{name}"))
        for name in _SELECTOR_METHODS:
            _set(cls, name, _loop_wrapper(getattr(cls, name), f"loop.{name}"))
        _set(cls, "run_forever", _uvloop_run_forever(cls.run_forever))


def unpatch() -> None:
    """Put every original back, identity-wise. Caller holds the package lock."""
    while _applied:
        owner, name, orig = _applied.pop()
        if orig is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, orig)


def patched() -> bool:
    return bool(_applied)
