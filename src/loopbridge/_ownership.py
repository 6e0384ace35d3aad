"""Ownership records: which loop an object belongs to now, and the one test for it.

An :class:`Ownership` record is attached to every loop-affine instance (by
:func:`~loopbridge.loop_affine` or :func:`~loopbridge.adopt`).  It holds the
current :class:`Owner` (the loop, and how to test for it: one immutable record
that a transfer replaces whole), the member declarations, the owner's port and
the object's metrics.  ``ON_OWNER`` is the text of "is this thread running the
owner loop?", inlined by every generated wrapper; :func:`on_owner_thread` is
compiled from it.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import weakref
from collections.abc import Callable, Hashable, Mapping
from types import MappingProxyType, MemberDescriptorType
from typing import Any

from ._codegen import compile_function
from ._compat import THREAD_ID_ATTR, get_running_loop, is_stock_loop
from ._errors import Advice, Fix, OwnerLoopClosed, refuse
from ._metrics import Metrics
from ._ports import Port, port_for_loop
from ._trio import in_trio_run

__all__ = [
    "Ownership",
    "Owner",
    "declarations_key",
    "ownership_of",
    "attach",
    "on_owner_thread",
    "ON_OWNER",
    "ON_OWNER_THREAD",
    "ON_OWNER_LOOP",
]

_ATTR = "__loopbridge_ownership__"


class Ownership:
    """Owner loop plus member declarations of one instance.

    ``returns`` maps member names to :class:`~loopbridge._returns.Owned` rules
    (typed ``Any`` here: rules live in a layer above this one).  ``inherits``:
    the object was handed out under such a rule, so what its members give back
    is covered too (see :mod:`loopbridge._returns`).
    """

    __slots__ = (
        "owner",
        "_port",
        "stable",
        "threadsafe",
        "returns",
        "read_ahead",
        "_key",
        "_lock",
        "name",
        "metrics",
        "obj_id",
        "made_in_trio",
        "inherits",
        "__weakref__",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        stable: frozenset[str],
        threadsafe: frozenset[str],
        name: str,
        returns: Mapping[str, Any] | None = None,
        read_ahead: Mapping[str, int | None] | None = None,
        inherits: bool = False,
        key: Hashable | None = None,
    ) -> None:
        """``key``: what :func:`declarations_key` gives for these declarations,
        if the caller keeps it (one per rule); None: computed here."""
        self.owner = Owner(loop)
        self._port: Port | None = None
        self.stable = stable
        self.threadsafe = threadsafe
        # The object was handed out under a rule (see _returns): what its members
        # give back is covered too, at every depth; ``returns`` is then the rule's
        # own read-only mapping, whose protocol steps inherit.
        self.inherits = inherits
        # Rules for members whose results belong to the owner loop (see _returns).
        self.returns: Mapping[str, Any] = (
            returns if inherits and returns is not None else MappingProxyType(dict(returns or {}))
        )
        # How far each stream member may read ahead (see _streams.Channel.ahead).
        self.read_ahead: Mapping[str, int | None] = (
            MappingProxyType(dict(read_ahead)) if read_ahead else _NO_READ_AHEAD
        )
        self._key = (
            key
            if key is not None
            else declarations_key(stable, threadsafe, self.returns, self.read_ahead, inherits)
        )
        self._lock = threading.Lock()
        self.name = name
        self.metrics = Metrics._create(name)
        self.obj_id = 0  # id() of the object it is attached to (attach sets it)
        # Made with no loop inside a trio run: trio runs no asyncio loop to own it.
        self.made_in_trio = loop is None and in_trio_run()

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        # A record belongs to one object in one process: a copy or an unpickled
        # object has none (a @loop_affine class gives its copies their own, see
        # _declare), never this one, and pickling it never fails on its contents.
        return (_no_record, ())

    def spec_key(self) -> Hashable:
        """The declarations as one hashable value (a proxy class is cached by it)."""
        return self._key  # declarations are fixed at construction

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
            raise refuse(self._no_owner())
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

    def _no_owner(self) -> Advice:
        transfer = Fix(
            "run", "loopbridge.transfer(obj, loop)", target="obj", say="give it one with"
        )
        if self.made_in_trio:
            return Advice(
                f"{self.name} has no owner loop: it was created inside a trio run, and a "
                "loop-affine object belongs to an asyncio loop",
                [
                    Fix(
                        "loop",
                        "trio.to_thread.run_sync(loop_thread.run, make)",
                        target="make",
                        say="create it on one, in a coroutine function make that a LoopThread runs:",
                    ),
                    transfer,
                ],
                "Then await its proxy's members from trio.",
            )
        return Advice(
            f"{self.name} has no owner loop: it was created while no event loop was running",
            [transfer],
        )

    def set_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            kept = _still_running(self, self.owner, self._port)
            # One store of an immutable record, built before it is published: readers
            # (no lock) see the old record or the new, whole (free-threaded build:
            # the store has release order; an old port they still read is re-routed).
            self.owner = Owner(loop, kept)
            self._port = None


#: The read-ahead declarations of a record that has none (most): one, shared.
_NO_READ_AHEAD: Mapping[str, int | None] = MappingProxyType({})


def declarations_key(
    stable: frozenset[str],
    threadsafe: frozenset[str],
    returns: Mapping[str, Any],
    read_ahead: Mapping[str, int | None],
    inherits: bool,
) -> Hashable:
    """A record's declarations as one hashable value (:meth:`Ownership.spec_key`)."""
    return (
        stable,
        threadsafe,
        frozenset(returns.items()),
        frozenset(read_ahead.items()),
        inherits,
    )


def _still_running(
    ownership: Ownership, old: Owner, port: Port | None
) -> weakref.WeakKeyDictionary[asyncio.Task[Any], asyncio.AbstractEventLoop] | None:
    """The tasks that keep using the object on the loop it is leaving, each with
    that loop: the calls and streams of the object already running there, and
    the task that transfers it, if it runs there; plus those an earlier transfer
    kept that have not ended.  Each keeps the object's members until it ends."""
    kept: weakref.WeakKeyDictionary[asyncio.Task[Any], asyncio.AbstractEventLoop]
    kept = weakref.WeakKeyDictionary()
    if old.kept is not None:
        kept.update((t, lp) for t, lp in old.kept.items() if not t.done())
    loop = old.loop
    if loop is not None:
        if get_running_loop() is loop:
            task = asyncio.current_task(loop)
            if task is not None:
                kept[task] = loop
        if port is not None and port.loop is loop:
            for op in list(port.inflight):  # a copy, made under the dict's lock: others add, remove
                task = getattr(op, "task", None)
                opts = getattr(op, "opts", None)
                mine = getattr(opts, "ownership", None) is ownership
                if task is not None and mine and not task.done():
                    kept[task] = loop
    return kept or None


class Owner:
    """The owner loop and how to test for it: immutable, replaced whole by a transfer.

    ``tid_check``: stock asyncio loops hold the ident of the thread running them
    (see _compat), so "is this thread running the owner?" is one comparison.
    ``kept``: after a transfer, the work already running on the old loop that
    keeps the object's members until it ends (only the slow half of the
    affinity check reads it).
    """

    __slots__ = ("loop", "tid_check", "thread", "kept")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None,
        kept: Mapping[asyncio.Task[Any], asyncio.AbstractEventLoop] | None = None,
    ) -> None:
        self.loop = loop
        # Tasks still running on a loop the object was transferred away from,
        # each with that loop: they keep using the object's members there until
        # they end (see _still_running); None: none.
        self.kept = kept
        self.tid_check = is_stock_loop(loop)
        # The thread running the loop, where that is known here (errors name it;
        # uvloop does not say): the owner is the running loop, or a stock one.
        self.thread: int | None = (
            _get_ident()
            if loop is not None and loop is get_running_loop()
            else getattr(loop, THREAD_ID_ATTR, None)
            if self.tid_check
            else None
        )

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
# Where an instance's record is kept, in order: its ``__dict__`` (most objects);
# the ``__loopbridge_ownership__`` slot that @loop_affine adds to a class whose
# instances have no __dict__ (see _declare); else, for an adopted object of such
# a class, a table keyed by ``id()`` whose entry a weak reference removes when
# the object dies.  The table never hashes or compares the object (equal
# dataclasses are distinct objects, unhashable ones are common); only an object
# that has neither a __dict__ nor weak references is kept alive by its entry.
_foreign: dict[int, tuple[object, Ownership]] = {}


def _no_record() -> None:
    return None


def ownership_of(obj: object) -> Ownership | None:
    """The record attached to ``obj`` itself (a shallow copy's shared one is not its own)."""
    ownership: Ownership | None = None
    slot = getattr(type(obj), _ATTR, None)
    if type(slot) is MemberDescriptorType:  # a slot @loop_affine added (see _declare)
        try:
            ownership = slot.__get__(obj, type(obj))
        except AttributeError:  # made without __init__ (copy, pickle)
            pass
    else:
        d = getattr(obj, "__dict__", None)
        if type(d) is dict:
            ownership = d.get(_ATTR)
    if ownership is not None:
        return ownership if ownership.obj_id == id(obj) else None
    entry = _foreign.get(id(obj))
    if entry is None:
        return None
    ref, ownership = entry
    held = ref() if type(ref) is weakref.ref else ref
    return ownership if held is obj else None


def attach(obj: object, ownership: Ownership) -> None:
    ownership.obj_id = id(obj)
    slot = getattr(type(obj), _ATTR, None)
    if type(slot) is MemberDescriptorType:
        slot.__set__(obj, ownership)
        return
    d = getattr(obj, "__dict__", None)
    if type(d) is dict:
        d[_ATTR] = ownership
        return
    key = id(obj)
    try:
        ref: object = weakref.ref(obj, functools.partial(_forget, key))
    except TypeError:
        ref = obj  # neither a __dict__ nor weak references: keep it alive with its record
    _foreign[key] = (ref, ownership)


def _forget(
    key: int, ref: weakref.ref[object], _exiting: Callable[[], bool] = sys.is_finalizing
) -> None:
    if _exiting():
        return  # interpreter exit: this module's globals may already be None
    entry = _foreign.get(key)
    if entry is not None and entry[0] is ref:
        del _foreign[key]
