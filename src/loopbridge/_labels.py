"""How loopbridge names loops and threads in errors, dumps, reports and metrics.

One format everywhere, so that a loop named in a sanitizer report, a hang dump,
an error and a Prometheus label is recognisably the same loop: ``"<library> loop
0x<id>"`` (``asyncio loop 0x7f...``, ``uvloop loop 0x7f...``), led by the name of
what runs it where that is known (``LoopThread 'engine', asyncio loop 0x7f...``).
"""

from __future__ import annotations

import weakref

from ._compat import live_thread

__all__ = ["loop_label", "name_loop", "thread_name", "loop_and_thread"]

#: The names given to loops by what runs them (a LoopThread's loop:
#: ``"LoopThread 'engine'"``).
_names: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def name_loop(loop: object, name: str) -> None:
    """Give ``loop`` the name its labels lead with (``"LoopThread 'engine'"``)."""
    try:
        _names[loop] = name
    except TypeError:  # pragma: no cover - a loop without weak references
        pass


def loop_label(loop: object) -> str:
    """``"asyncio loop 0x7f..."``: the library that made the loop, and its id; led by
    the loop's name where it has one: ``"LoopThread 'engine', asyncio loop 0x7f..."``."""
    library = type(loop).__module__.split(".")[0]
    label = f"{library} loop 0x{id(loop):x}"
    try:
        name = _names.get(loop)
    except TypeError:  # pragma: no cover - a loop without weak references
        name = None
    return label if name is None else f"{name}, {label}"


def thread_name(ident: int | None) -> str:
    """The name of the live thread ``ident``, or ``"thread <ident>"``."""
    thread = live_thread(ident) if ident is not None else None
    return thread.name if thread is not None else f"thread {ident}"


def loop_and_thread(loop: object | None, ident: int | None) -> str:
    """``"asyncio loop 0x7f... on thread 'owner' (id 1401...)"``: two loops of one kind
    have the same ``repr``, so an error that names two says which is which."""
    where = f"thread {thread_name(ident)!r} (id {ident})" if ident is not None else "no thread yet"
    if loop is None:
        return f"no asyncio loop (trio, or none running) on {where}"
    return f"{loop_label(loop)} on {where}"
