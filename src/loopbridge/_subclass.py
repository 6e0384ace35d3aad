"""Generated subclasses of any class, and instances of them made without the class's
constructor.

A proxy (and the tripwire of an uncovered result) is an instance of a class
generated as a subclass of the object's own class, so ``isinstance`` holds.  The
proxy must never run that class's ``__new__`` or ``__init__`` (user code, made
for real instances).  For a class whose instances are laid out by Python,
``object.__new__`` makes an empty instance.  For one with a C layout (a Future,
a Task, a deque, a ``str`` subclass) ``object.__new__`` refuses ("not safe"), and
the empty instance must come from the ``__new__`` of the C type that fixes the
layout, called with no arguments: it allocates and sets no state.

Invariants:

* :func:`make_class` returns a class and the function that makes its
  instances, found once, by making one: it never fails later, per instance;
* a class that cannot be subclassed (final, a C type that refuses) or whose
  empty instance cannot be made gets a plain class with the same members
  instead (``isinstance`` with the original class then fails: there is no other
  way);
* only C ``__new__`` functions are called, never one written in Python.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

__all__ = ["make_class", "Maker"]

#: Makes an empty instance of the given class.
Maker = Callable[[type], Any]


def _c_makers(cls: type) -> list[Maker]:
    """``object.__new__``, then the C ``__new__`` of each C type in ``cls``'s MRO."""
    out: list[Maker] = [object.__new__]
    for klass in cls.__mro__:
        new = klass.__dict__.get("__new__")
        if isinstance(new, types.BuiltinFunctionType) and new is not object.__new__:
            out.append(new)
    return out


def _maker_for(pcls: type) -> Maker | None:
    """How to make an empty instance of ``pcls``: tried once, here."""
    for new in _c_makers(pcls):
        try:
            new(pcls)
        except Exception:  # a C __new__ that needs arguments, or refuses this layout
            continue
        return new
    return None


def make_class(cls: type, name: str, ns: dict[str, Any]) -> tuple[type, Maker]:
    """A subclass of ``cls`` named ``name`` with members ``ns`` (which has ``__slots__``),
    and the function that makes its empty instances.

    Tried in order: a slotted subclass; one without ``__slots__`` (variable-size
    C types such as ``int`` and ``tuple`` take no slots, so instances keep their
    own attributes in a ``__dict__``); a plain class with the same members.
    """
    unslotted = {k: v for k, v in ns.items() if k != "__slots__"}
    for body in (ns, unslotted):
        try:
            pcls = type(cls)(name, (cls,), dict(body))
        except TypeError:  # final, a C type that refuses, a slot layout conflict
            continue
        maker = _maker_for(pcls)
        if maker is not None:
            return pcls, maker
    pcls = type(name, (), dict(ns))
    return pcls, object.__new__
