"""The public ways to declare and move ownership: ``@loop_affine``, ``adopt``,
``owner_loop`` and ``transfer``."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from ._affinity import guarded
from ._compat import get_running_loop
from ._errors import LoopAffinityError, OwnerLoopClosed
from ._ownership import Ownership, attach, ownership_of
from ._ports import rearm

__all__ = ["loop_affine", "adopt", "owner_loop", "transfer"]

T = TypeVar("T")
C = TypeVar("C", bound=type)


def _current_loop(loop: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop | None:
    return loop if loop is not None else get_running_loop()


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
    attach(obj, ownership)
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
                attach(
                    self, Ownership(get_running_loop(), s, t, f"{type(self).__qualname__} object")
                )
            original_init(self, *args, **kwargs)

        klass.__init__ = __init__  # type: ignore[misc]
        for name, value in list(vars(klass).items()):
            if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):
                setattr(klass, name, guarded(value))
        return klass

    if cls is not None:
        return decorate(cls)
    return decorate


def _unproxy(obj: object) -> object:
    target = getattr(type(obj), "__loopbridge_proxy__", False)
    if target:
        return object.__getattribute__(obj, "_lb_target")
    return obj
