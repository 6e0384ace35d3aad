"""The public ways to declare and move ownership: ``@loop_affine``, ``adopt``,
``owner_loop`` and ``transfer``."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, overload

from ._affinity import guarded
from ._compat import get_running_loop
from ._errors import LoopAffinityError, OwnerLoopClosed
from ._ownership import Ownership, attach, ownership_of
from ._ports import rearm
from ._returns import Owned, check_rules, names

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
    returns: Mapping[str, Owned] | None = None,
) -> T:
    """Declare that an existing instance belongs to ``loop`` (default: the running loop).

    This is :func:`loop_affine` for classes you don't own, such as vLLM's
    ``AsyncLLM``.  ``stable`` names data members that any thread may read (set once
    at setup); ``threadsafe`` names sync members that any thread may call;
    ``returns`` gives members whose results belong to the owner loop a rule
    (:class:`Owned`) that brings them back as proxies.  Returns ``obj`` itself,
    unchanged.
    """
    if ownership_of(obj) is not None:
        raise LoopAffinityError(
            f"{type(obj).__qualname__} object is already loop-affine; "
            "use loopbridge.transfer() to change its owner"
        )
    base_stable, base_threadsafe, base_returns = _class_spec(type(obj))
    rules = check_rules(returns, "adopt(returns=...)")
    _check_members(obj, rules)
    ownership = Ownership(
        _current_loop(loop),
        names(stable, "adopt(stable=...)") | base_stable,
        names(threadsafe, "adopt(threadsafe=...)") | base_threadsafe,
        f"{type(obj).__qualname__} object",
        {**base_returns, **rules},
    )
    attach(obj, ownership)
    return obj


def _check_members(obj: object, rules: Mapping[str, Owned]) -> None:
    """A rule for a member the object does not have is a typo: say so now."""
    for name in rules:
        if not hasattr(obj, name):
            raise LoopAffinityError(
                f"returns={{{name!r}: ...}}: {type(obj).__qualname__} object has no member "
                f"{name!r}, so the rule would never apply; check the name"
            )


_NO_SPEC: tuple[frozenset[str], frozenset[str], Mapping[str, Owned]] = (
    frozenset(),
    frozenset(),
    {},
)


def _class_spec(cls: type) -> tuple[frozenset[str], frozenset[str], Mapping[str, Owned]]:
    spec = cls.__dict__.get("__loopbridge_spec__")
    if spec is None:
        for base in cls.__mro__[1:]:
            spec = base.__dict__.get("__loopbridge_spec__")
            if spec is not None:
                break
    return spec if spec is not None else _NO_SPEC


@overload
def loop_affine(cls: C, /) -> C: ...


@overload
def loop_affine(
    *,
    stable: Iterable[str] = (),
    threadsafe: Iterable[str] = (),
    returns: Mapping[str, Owned] | None = None,
) -> Callable[[C], C]: ...


def loop_affine(
    cls: C | None = None,
    /,
    *,
    stable: Iterable[str] = (),
    threadsafe: Iterable[str] = (),
    returns: Mapping[str, Owned] | None = None,
) -> C | Callable[[C], C]:
    """Class decorator: each instance belongs to the loop running at construction.

    An instance created while no loop runs has no owner until
    :func:`transfer` gives it one.  Direct calls of its async members from a loop
    that doesn't own it raise :class:`LoopAffinityError` (see
    :func:`set_affinity_check`); use :func:`proxy` to call it from anywhere.
    ``returns`` declares members whose results belong to the owner loop
    (see :class:`Owned`).
    """
    stable_set = names(stable, "@loop_affine(stable=...)")
    threadsafe_set = names(threadsafe, "@loop_affine(threadsafe=...)")
    rules = check_rules(returns, "@loop_affine(returns=...)")

    def decorate(klass: C) -> C:
        base_stable, base_threadsafe, base_returns = _class_spec(klass)
        klass.__loopbridge_spec__ = (  # type: ignore[attr-defined]
            base_stable | stable_set,
            base_threadsafe | threadsafe_set,
            {**base_returns, **rules},
        )
        # mypy flags reading __init__ off a class object; this is the class's own one.
        original_init = klass.__init__  # type: ignore[misc, unused-ignore]

        @functools.wraps(original_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if ownership_of(self) is None:
                s, t, r = _class_spec(type(self))
                name = f"{type(self).__qualname__} object"
                attach(self, Ownership(get_running_loop(), s, t, name, r))
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
