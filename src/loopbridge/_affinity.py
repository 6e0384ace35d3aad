"""The always-on affinity check: a direct call of a loop-affine async member from a
loop that does not own the object is caught at the call site.

Each async member of a ``@loop_affine`` class is replaced by a wrapper generated
from one template (:data:`_GUARD`) with the member's own signature; it inlines
``ON_OWNER`` and only off the owner's loop calls the slow half, which applies the
policy (:func:`set_affinity_check`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

from ._codegen import build, inline_prologue
from ._compat import get_running_loop, mark_coroutine_function, thread_id_of
from ._errors import Advice, Fix, code_name, refuse
from ._labels import loop_and_thread
from ._ownership import _ATTR, ON_OWNER, Owner, ownership_of
from ._ports import PORT_ATTR
from ._trio import in_trio_run

__all__ = ["set_affinity_check", "guarded", "original"]

_ORIGINAL = "__loopbridge_original__"
_get_ident = threading.get_ident


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


def _affinity_violation(
    self: object,
    fn: Callable[..., object],
    loop: asyncio.AbstractEventLoop | None,
    owner: Owner,
) -> None:
    here = loop_and_thread(loop, _get_ident())
    there = loop_and_thread(owner.loop, owner.thread or _owner_thread(owner.loop))
    cls = type(self).__qualname__
    target, member = code_name(cls), f"{fn.__name__}(...)"
    advice = Advice(
        f"{cls}.{fn.__name__}() called from {here}, but the object belongs to {there}",
        [
            Fix("loop", f"loopbridge.proxy({target}).{member}", target=target),
            Fix("thread", f"loopbridge.blocking({target}).{member}", target=target),
        ],
        "The proxy runs it on the owner loop.",
    )
    if _Policy.mode == "raise":
        raise refuse(advice)
    warnings.warn(advice.render(), RuntimeWarning, stacklevel=3)


def _owner_thread(loop: asyncio.AbstractEventLoop | None) -> int | None:
    """The thread running ``loop``: stock loops say; for others, their port saw it."""
    ident = thread_id_of(loop)
    if ident is None:
        ident = getattr(getattr(loop, PORT_ATTR, None), "thread_id", None)
    return ident


def guarded(fn: Callable[..., object], slotted: bool = False) -> Callable[..., object]:
    """Wrap an async member so direct use off its owner loop is caught.

    The check runs at the first step, where the coroutine (or async generator)
    runs, whoever made it (``asyncio.run(obj.m())`` from a plain thread, a
    coroutine made on the owner and sent to another loop with
    ``run_coroutine_threadsafe``, direct use under trio): it is compiled into
    the member's own body (:func:`_inlined`).  Where that can't be done, a
    coroutine function gets a wrapper coroutine function that checks at its
    first step, and an async generator function a wrapper that checks where
    the generator is made.  Each wrapper has the member's exact signature where
    it can be mirrored (``*args, **kwargs`` forwarding costs more than the check
    itself) and inlines :data:`ON_OWNER`; only off the owner's loop does it call
    the slow half, :func:`_check`.  ``slotted``: the instances keep their record
    in the ``__loopbridge_ownership__`` slot (they have no ``__dict__``).
    """
    coro = inspect.iscoroutinefunction(fn)
    guarded = _inlined(fn, slotted)
    if guarded is not None:
        functools.update_wrapper(guarded, fn)
        setattr(guarded, _ORIGINAL, fn)
        return guarded
    template = _GUARD_CORO if coro else _GUARD
    if slotted:
        template = template.replace(_FROM_DICT, _FROM_SLOT)
    guarded = build(
        template,
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
    if coro and not inspect.iscoroutinefunction(guarded):
        mark_coroutine_function(guarded)  # plain forwarding of a decorated coroutine function
    return guarded


def _inlined(fn: Callable[..., object], slotted: bool) -> Callable[..., object] | None:
    """``fn`` with the check compiled in front of its body (no wrapper, no extra
    frame); ``None`` where that can't be done exactly (see ``inline_prologue``)."""
    code = getattr(fn, "__code__", None)
    if code is None or not code.co_argcount:
        return None
    text = _PROLOGUE.format(self=code.co_varnames[0])
    if slotted:
        text = text.replace(
            _FROM_DICT.format(self=code.co_varnames[0]), _FROM_SLOT.format(self=code.co_varnames[0])
        )
    env = {
        "_loopbridge_fn": fn,
        "_loopbridge_check": _check,
        "_loopbridge_ident": _get_ident,
        "_loopbridge_grl": get_running_loop,
        "_loopbridge_key": _ATTR,
    }
    return inline_prologue(fn, text.replace("__lb_", "_loopbridge_"), env)


def _check(self: object, fn: Callable[..., object], first_step: bool = False) -> None:
    """The slow half of the check: this thread does not run the owner loop.

    At a coroutine's first step (``first_step``) no running asyncio loop is
    a violation too: the coroutine runs under trio, or is driven by hand.
    Where a generator is made, no loop is fine: it may be handed to the owner.
    """
    ownership = ownership_of(self)
    if ownership is None:
        return
    owner = ownership.owner
    if owner.loop is None or _Policy.mode == "off":
        return
    loop = get_running_loop()
    if loop is not owner.loop and (loop is not None or first_step or in_trio_run()):
        if loop is not None and _kept_here(owner, loop):
            return
        _affinity_violation(self, fn, loop, owner)


def _kept_here(owner: Owner, loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the running task is work that was already running on ``loop`` when
    the object was transferred away from it (see ``Owner.kept``): such work keeps
    the object's members until it ends, as a method goes on natively."""
    kept = owner.kept
    if kept is None:
        return False
    task = asyncio.current_task(loop)
    return task is not None and kept.get(task) is loop


_ON_OWNER_TEST = """
        __lb_ownership = {self}.__dict__.get(__lb_key)
        if __lb_ownership is not None and not (
            (__lb_owner := __lb_ownership.owner) and """ + ON_OWNER.format(owner="__lb_owner")
_FROM_DICT = "{self}.__dict__.get(__lb_key)"
# Instances without a __dict__ keep the record in a slot.
_FROM_SLOT = "getattr({self}, __lb_key, None)"

_GUARD = (
    """
def make({make_params}):
    def guarded({params}):"""
    + _ON_OWNER_TEST
    + """
        ):
            __lb_check({self}, __lb_fn)
        return __lb_fn({self}, {args})
    return guarded
"""
)
# Compiled into a coroutine function's own body (see _inlined): the same test.
_PROLOGUE = (
    "if (__lb_ownership := "
    + _FROM_DICT
    + ") is not None and not (\n    (__lb_owner := __lb_ownership.owner) and "
    + ON_OWNER.format(owner="__lb_owner")
    + "\n):\n    __lb_check({self}, __lb_fn, True)\n"
)
# A coroutine function's wrapper, where it can't be compiled in: the same test,
# at the coroutine's first step.
_GUARD_CORO = (
    """
def make({make_params}):
    async def guarded({params}):"""
    + _ON_OWNER_TEST
    + """
        ):
            __lb_check({self}, __lb_fn, True)
        return await __lb_fn({self}, {args})
    return guarded
"""
)


def original(fn: object) -> Any:
    """The member a guarded wrapper wraps, else ``fn`` itself (``Any``: the caller
    knows what kind of class attribute it looked up)."""
    return getattr(fn, _ORIGINAL, fn)
