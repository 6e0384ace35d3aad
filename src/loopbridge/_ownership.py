"""Ownership: which loop an object belongs to, and how its members may be used.

An :class:`Ownership` record is attached to every loop-affine instance, either by
the :func:`loop_affine` class decorator or by :func:`adopt` for classes we don't
own.  It names the owner loop and the member *declarations* (``stable`` data that
any thread may read, ``threadsafe`` sync members any thread may call).  Member
*kinds* (async method, async generator, sync, ...) are derived from the class,
never listed by hand, so a new member of the class is classified automatically.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from ._codegen import build, compile_function
from ._compat import THREAD_ID_ATTR, get_running_loop, is_stock_loop, mark_coroutine_function
from ._errors import LoopAffinityError, OwnerLoopClosed
from ._metrics import Metrics
from ._ports import Port, port_for_loop, rearm

__all__ = [
    "Ownership",
    "Owner",
    "MemberKind",
    "loop_affine",
    "adopt",
    "owner_loop",
    "transfer",
    "ownership_of",
    "classify",
    "PROXY_OWNED_DUNDERS",
    "set_affinity_check",
]

T = TypeVar("T")
C = TypeVar("C", bound=type)

_ATTR = "__loopbridge_ownership__"
_ORIGINAL = "__loopbridge_original__"


class MemberKind(enum.Enum):
    ASYNC = "async method"  # marshalled call
    STREAM = "async generator"  # marshalled stream
    ITERATION = "async iteration"  # a sync __aiter__: the object's iteration, streamed
    STABLE = "stable"  # read directly from any thread (declared)
    THREADSAFE = "thread-safe"  # called directly from any thread (declared)
    CLASS_LEVEL = "class-level"  # staticmethod, classmethod, class constant
    SYNC = "sync"  # refused through a proxy


class Ownership:
    """Owner loop plus member declarations of one instance."""

    __slots__ = (
        "owner",
        "_port",
        "stable",
        "threadsafe",
        "_lock",
        "name",
        "metrics",
        "__weakref__",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        stable: frozenset[str],
        threadsafe: frozenset[str],
        name: str,
    ) -> None:
        self.owner = Owner(loop)
        self._port: Port | None = None
        self.stable = stable
        self.threadsafe = threadsafe
        self._lock = threading.Lock()
        self.name = name
        self.metrics = Metrics._create(name)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.owner.loop

    def port(self) -> Port:
        """The owner's port; raises if unbound or if the owner loop is gone."""
        port = self._port
        if port is not None and port.dead is None:
            return port
        loop = self.owner.loop
        if loop is None:
            raise LoopAffinityError(
                f"{self.name} has no owner loop: it was created while no event loop was "
                "running. Call loopbridge.transfer(obj, loop) to give it one."
            )
        with self._lock:
            if self.owner.loop is loop:
                try:
                    self._port = port = port_for_loop(loop)
                except OwnerLoopClosed as exc:
                    raise OwnerLoopClosed(
                        f"the owner loop of {self.name} is gone ({exc}); "
                        "loopbridge.transfer(obj, loop) moves the object to a running loop"
                    ) from None
        return port if port is not None else self.port()

    def set_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self.owner = Owner(loop)  # one store: readers see the old record or the new
            self._port = None


class Owner:
    """The owner loop and how to test for it: immutable, replaced whole by a transfer.

    ``tid_check``: stock asyncio loops hold the ident of the thread running them
    (see _compat), so "is this thread running the owner?" is one comparison.
    """

    __slots__ = ("loop", "tid_check")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.tid_check = is_stock_loop(loop)

    def __bool__(self) -> bool:
        return True  # lets templates bind it inside a condition (``(o := ...) and ...``)


# "Is the owner loop the loop running on this thread?" -- the one test behind
# the affinity check, on_owner_thread() and the same-loop fast path of proxy
# members.  Generated wrappers inline it (a call would cost as much as the
# test); on_owner_thread() is compiled from the same text.  Needs __lb_ident
# (threading.get_ident) and __lb_grl (get_running_loop) in scope.
#
# Two halves, so that proxy members can keep the running loop they look up:
# ON_OWNER_THREAD compares thread idents on stock loops (cheaper than
# get_running_loop(), a getpid() system call per use on 3.11); ON_OWNER_LOOP
# compares a running loop ({loop}, evaluated once) with the owner's.  The
# affinity check skips the second half on stock loops, where the first decides.
#
# {owner} names a local bound once to ``ownership.owner``: the record is read
# in one load, so a transfer (which swaps the whole record) is seen entirely or
# not at all, never a new loop with the old loop's way of testing it.
ON_OWNER_THREAD = "({owner}.tid_check and __lb_ident() == {owner}.loop." + THREAD_ID_ATTR + ")"
ON_OWNER_LOOP = "(({loop}) is {owner}.loop and {owner}.loop is not None)"
ON_OWNER = (
    "("
    + ON_OWNER_THREAD
    + " or (not {owner}.tid_check and "
    + ON_OWNER_LOOP.replace("{loop}", "__lb_grl()")
    + "))"
)

_get_ident = threading.get_ident

on_owner_thread: Callable[[Ownership], bool] = compile_function(
    "def make(__lb_ident, __lb_grl):\n"
    "    def on_owner_thread(ownership):\n"
    "        owner = ownership.owner\n"
    f"        return {ON_OWNER.format(owner='owner')}\n"
    "    return on_owner_thread\n",
    "on_owner_thread",
    "make",
)(_get_ident, get_running_loop)
on_owner_thread.__doc__ = "True when the owner loop is the loop running on this thread."


# --------------------------------------------------------------------- lookup
_foreign: weakref.WeakKeyDictionary[Any, Ownership] = weakref.WeakKeyDictionary()
_foreign_by_id: dict[int, tuple[Any, Ownership]] = {}


def ownership_of(obj: object) -> Ownership | None:
    d = getattr(obj, "__dict__", None)
    if d is not None:
        ownership = d.get(_ATTR)
        if ownership is not None:
            return ownership  # type: ignore[no-any-return]
    try:
        return _foreign.get(obj)
    except TypeError:
        entry = _foreign_by_id.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None


def _attach(obj: object, ownership: Ownership) -> None:
    d = getattr(obj, "__dict__", None)
    if d is not None:
        d[_ATTR] = ownership
        return
    try:
        _foreign[obj] = ownership
    except TypeError:
        # Neither a __dict__ nor weak references: keep it alive with its record.
        _foreign_by_id[id(obj)] = (obj, ownership)


def _current_loop(loop: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop | None:
    return loop if loop is not None else get_running_loop()


# ---------------------------------------------------------- public functions
def owner_loop(obj: object) -> asyncio.AbstractEventLoop | None:
    """The loop that owns ``obj``, or ``None`` if it has none yet.

    Raises :class:`LoopAffinityError` if ``obj`` is not loop-affine at all.
    """
    ownership = ownership_of(_unproxy(obj))
    if ownership is None:
        raise LoopAffinityError(
            f"{type(obj).__qualname__} object is not loop-affine: decorate its class with "
            "@loop_affine or declare the instance with loopbridge.adopt(obj)"
        )
    return ownership.loop


def transfer(obj: object, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Bind ``obj`` to ``loop`` (default: the running loop), or move it there.

    Typical use: a worker created outside any loop records its loop during
    initialisation.  Calls already running on the old owner finish there; calls
    submitted but not yet started are re-routed to the new owner when they reach
    the old one, so a transfer never loses or misroutes a call.
    """
    ownership = ownership_of(_unproxy(obj))
    if ownership is None:
        raise LoopAffinityError(
            f"{type(obj).__qualname__} object is not loop-affine; use adopt(obj, loop=...) first"
        )
    target = _current_loop(loop)
    if target is None:
        raise LoopAffinityError("transfer() needs a loop: pass one, or call it from a running loop")
    if target.is_closed():
        raise OwnerLoopClosed(f"cannot transfer to {target!r}: it is closed")
    rearm(target)
    ownership.set_loop(target)


def adopt(
    obj: T,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    stable: Iterable[str] = (),
    threadsafe: Iterable[str] = (),
) -> T:
    """Declare that an existing instance belongs to ``loop`` (default: the running loop).

    This is :func:`loop_affine` for classes you don't own, such as vLLM's
    ``AsyncLLM``.  ``stable`` names data members that any thread may read (set once
    at setup); ``threadsafe`` names sync members that any thread may call.
    Returns ``obj`` itself, unchanged.
    """
    if ownership_of(obj) is not None:
        raise LoopAffinityError(
            f"{type(obj).__qualname__} object is already loop-affine; "
            "use loopbridge.transfer() to change its owner"
        )
    ownership = Ownership(
        _current_loop(loop),
        frozenset(stable) | _class_spec(type(obj))[0],
        frozenset(threadsafe) | _class_spec(type(obj))[1],
        f"{type(obj).__qualname__} object",
    )
    _attach(obj, ownership)
    return obj


def _class_spec(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    spec = cls.__dict__.get("__loopbridge_spec__")
    if spec is None:
        for base in cls.__mro__[1:]:
            spec = base.__dict__.get("__loopbridge_spec__")
            if spec is not None:
                break
    return spec if spec is not None else (frozenset(), frozenset())


@overload
def loop_affine(cls: C, /) -> C: ...


@overload
def loop_affine(
    *, stable: Iterable[str] = (), threadsafe: Iterable[str] = ()
) -> Callable[[C], C]: ...


def loop_affine(
    cls: C | None = None,
    /,
    *,
    stable: Iterable[str] = (),
    threadsafe: Iterable[str] = (),
) -> C | Callable[[C], C]:
    """Class decorator: each instance belongs to the loop running at construction.

    An instance created while no loop runs has no owner until
    :func:`transfer` gives it one.  Direct calls of its async members from a loop
    that doesn't own it raise :class:`LoopAffinityError` (see
    :func:`set_affinity_check`); use :func:`proxy` to call it from anywhere.
    """
    stable_set, threadsafe_set = frozenset(stable), frozenset(threadsafe)

    def decorate(klass: C) -> C:
        base_stable, base_threadsafe = _class_spec(klass)
        klass.__loopbridge_spec__ = (  # type: ignore[attr-defined]
            base_stable | stable_set,
            base_threadsafe | threadsafe_set,
        )
        # mypy flags reading __init__ off a class object; this is the class's own one.
        original_init = klass.__init__  # type: ignore[misc, unused-ignore]

        @functools.wraps(original_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if ownership_of(self) is None:
                s, t = _class_spec(type(self))
                _attach(
                    self, Ownership(get_running_loop(), s, t, f"{type(self).__qualname__} object")
                )
            original_init(self, *args, **kwargs)

        klass.__init__ = __init__  # type: ignore[misc]
        for name, value in list(vars(klass).items()):
            if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):
                setattr(klass, name, _guarded(value))
        return klass

    if cls is not None:
        return decorate(cls)
    return decorate


# ---------------------------------------------------- always-on ownership check
class _Policy:
    mode = os.environ.get("LOOPBRIDGE_AFFINITY_CHECK", "raise")


def set_affinity_check(mode: str) -> str:
    """Set what a direct cross-loop call of a ``@loop_affine`` async member does.

    ``"raise"`` (default) raises :class:`LoopAffinityError`, ``"warn"`` issues a
    ``RuntimeWarning`` and proceeds, ``"off"`` skips the check.  Returns the previous
    mode.  The environment variable ``LOOPBRIDGE_AFFINITY_CHECK`` sets the initial mode.
    """
    if mode not in ("raise", "warn", "off"):
        raise ValueError(f"affinity check mode must be 'raise', 'warn' or 'off', not {mode!r}")
    old, _Policy.mode = _Policy.mode, mode
    return old


def _affinity_violation(self: Any, fn: Callable[..., Any], loop: Any, owner: Any) -> None:
    msg = (
        f"{type(self).__qualname__}.{fn.__name__}() called from {loop!r}, but the object "
        f"belongs to {owner!r}. Call it through loopbridge.proxy(obj) instead, which runs "
        "it on the owner loop."
    )
    if _Policy.mode == "raise":
        raise LoopAffinityError(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an async member so direct use from a foreign loop is caught at the call site.

    The wrapper has the member's exact signature where it can be mirrored
    (``*args, **kwargs`` forwarding costs more than the check itself) and
    inlines :data:`ON_OWNER`; only off the owner's loop does it call the slow
    half, :func:`_check`.
    """
    guarded = build(
        _GUARD,
        fn,
        "check",
        __lb_fn=fn,
        __lb_check=_check,
        __lb_ident=_get_ident,
        __lb_grl=get_running_loop,
        __lb_key=_ATTR,
    )
    functools.update_wrapper(guarded, fn)
    setattr(guarded, _ORIGINAL, fn)
    if inspect.iscoroutinefunction(fn):
        mark_coroutine_function(guarded)
    return guarded


def _check(self: Any, fn: Callable[..., Any]) -> None:
    """The slow half of the check: this thread does not run the owner loop."""
    ownership = self.__dict__.get(_ATTR)
    if ownership is None:
        return
    owner = ownership.owner.loop
    if owner is None or _Policy.mode == "off":
        return
    loop = get_running_loop()
    if loop is not owner and loop is not None:
        _affinity_violation(self, fn, loop, owner)


_GUARD = (
    """
def make({make_params}):
    def guarded({params}):
        __lb_ownership = {self}.__dict__.get(__lb_key)
        if __lb_ownership is not None and not (
            (__lb_owner := __lb_ownership.owner) and """
    + ON_OWNER.format(owner="__lb_owner")
    + """
        ):
            __lb_check({self}, __lb_fn)
        return __lb_fn({self}, {args})
    return guarded
"""
)


def original(fn: Any) -> Any:
    return getattr(fn, _ORIGINAL, fn)


# ---------------------------------------------------------- classification
#: Special methods the proxy class defines itself (how a proxy is built, shown,
#: pickled and how its attributes are looked up), whatever the class defines.
PROXY_OWNED_DUNDERS = frozenset(
    {
        "__init__",
        "__new__",
        "__del__",
        "__repr__",
        "__getattr__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__reduce__",
        "__reduce_ex__",
        "__init_subclass__",
        "__class_getitem__",
        "__subclasshook__",
    }
)


def classify(cls: type, ownership: Ownership) -> dict[str, tuple[MemberKind, Any]]:
    """Every member of ``cls`` (MRO order, first definition wins) with its kind.

    Returns ``{name: (kind, raw)}`` where ``raw`` is the unwrapped function for
    async members and the class attribute otherwise.  Special methods are
    members too: an ``async def __x__`` is marshalled like any async method, a
    sync ``__aiter__`` makes the object's own async iteration a stream, and any
    other special *method* is refused unless declared (Python calls it on the
    caller's thread: ``len(p)``, ``p == q``, ``with p``).  Special attributes
    that are not methods (``__module__``, ``__slots__``, ``__hash__ = None``) and
    those the proxy defines itself (:data:`PROXY_OWNED_DUNDERS`) are left out.
    """
    out: dict[str, tuple[MemberKind, Any]] = {}
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if name in out:
                continue
            if name.startswith("__") and name.endswith("__"):
                kind = _dunder_kind(name, raw, ownership)
                if kind is not None:
                    out[name] = (kind, raw)
                continue
            out[name] = (_kind(name, raw, ownership), raw)
    return out


def _dunder_kind(name: str, raw: Any, ownership: Ownership) -> MemberKind | None:
    if name in PROXY_OWNED_DUNDERS or isinstance(raw, (staticmethod, classmethod)):
        return None
    fn = original(raw)
    if not inspect.isfunction(fn):
        return None  # data, a slot or dict descriptor, __hash__ = None
    kind = _kind(name, raw, ownership)
    if kind is MemberKind.SYNC and name == "__aiter__":
        return MemberKind.ITERATION
    return kind


def _kind(name: str, raw: Any, ownership: Ownership) -> MemberKind:
    fn = original(raw)
    if name in ownership.stable:
        return MemberKind.STABLE
    if name in ownership.threadsafe:
        return MemberKind.THREADSAFE
    if isinstance(raw, (staticmethod, classmethod)):
        return MemberKind.CLASS_LEVEL
    if inspect.isasyncgenfunction(fn):
        return MemberKind.STREAM
    if inspect.iscoroutinefunction(fn):
        return MemberKind.ASYNC
    if inspect.isfunction(fn) or hasattr(raw, "__get__"):
        return MemberKind.SYNC
    return MemberKind.CLASS_LEVEL


def _unproxy(obj: object) -> object:
    target = getattr(type(obj), "__loopbridge_proxy__", False)
    if target:
        return object.__getattribute__(obj, "_lb_target")
    return obj
