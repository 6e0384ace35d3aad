"""Cheap capture of "where did this happen" for sanitizer reports.

A site is the first frame outside asyncio and outside the sanitizer itself:
the line of user (or library) code that called into asyncio. Capturing one
keeps a code object and a line number, never the frame, so locals are not
kept alive.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from types import CodeType, FrameType
from typing import Any, NamedTuple

_ASYNCIO_DIR = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

_THREADING_FILE = os.path.abspath(threading.__file__)

# Frames where a walk up the stack leaves the code that made the call and
# enters the machinery that ran it: an event loop's callback runner, or a
# thread's bootstrap.
_BOUNDARY = 2
_ASYNCIO = 1
_OTHER = 0

# file name -> kind. Keyed by the file name because str caches its hash and a
# code object does not (hashing one walks its constants). Races between
# threads only duplicate the computation.
_OWN = 3
_file_kinds: dict[str, int] = {}
_LOOP_MACHINERY = frozenset({"_run", "_run_once", "run_forever"})


def _file_kind(filename: str) -> int:
    path = os.path.abspath(filename)
    if path.startswith(_OWN_DIR):
        known = _OWN
    elif path == _THREADING_FILE:
        known = _BOUNDARY
    elif path.startswith(_ASYNCIO_DIR):
        known = _ASYNCIO
    else:
        known = _OTHER
    _file_kinds[filename] = known
    return known


def _kind(code: CodeType) -> int:
    known = _file_kinds.get(code.co_filename)
    if known is None:
        known = _file_kind(code.co_filename)
    if known == _ASYNCIO and code.co_name in _LOOP_MACHINERY:
        return _BOUNDARY
    return known


class Site(NamedTuple):
    """A code location and the thread that ran it (``code`` is ``None`` when
    no frame outside asyncio and loopbridge was found).

    Code objects do not pickle: a pickled site's ``code`` comes back as a
    stand-in with the same file name, name and (Python 3.11+) qualified name,
    which is all a report reads; it has no body to run, and compares unequal
    to the original.
    """

    code: CodeType | None
    lineno: int
    thread: str

    def __reduce__(self) -> tuple[Any, ...]:
        code = self.code
        if code is None:
            return Site, tuple(self)
        qualname = getattr(code, "co_qualname", code.co_name)
        named = (code.co_filename, code.co_name, qualname)
        return _unpickle_site, (named, self.lineno, self.thread)

    def where(self) -> str:
        if self.code is None:
            return "<unknown>"
        return f"{self.code.co_filename}:{self.lineno} in {self.code.co_name}"

    def __str__(self) -> str:
        return f"{self.where()} [thread {self.thread!r}]"


def _unpickle_site(named: tuple[str, str, str], lineno: int, thread: str) -> Site:
    filename, name, qualname = named
    code = compile("", filename, "exec").replace(co_name=name)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=qualname)
    return Site(code, lineno, thread)


def _first_outside(frame: FrameType | None) -> tuple[FrameType | None, FrameType | None]:
    """(first frame outside asyncio, outermost asyncio frame seen on the way).
    The walk stops at the loop machinery: a task started straight on an
    asyncio coroutine has no caller of interest below it. Inlined lookups:
    this runs for every future the sanitizer sees created."""
    outermost: FrameType | None = None
    kinds = _file_kinds
    while frame is not None:
        code = frame.f_code
        kind = kinds.get(code.co_filename)
        if kind is None:
            kind = _file_kind(code.co_filename)
        if kind == _OTHER:
            return frame, outermost
        if kind == _ASYNCIO:
            if code.co_name in _LOOP_MACHINERY:
                break
            outermost = frame
        elif kind == _BOUNDARY:
            break
        frame = frame.f_back
    return None, outermost


def _fallback(asyncio_frame: FrameType | None, name: str) -> Site:
    """No caller outside asyncio: the site that created the current task if
    the sanitizer saw it, else the outermost asyncio frame (e.g. Event.wait)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    site: Site | None = getattr(task, "_lb_site", None)
    if site is not None and site.code is not None:
        return Site(site.code, site.lineno, name)
    if asyncio_frame is not None:
        return Site(asyncio_frame.f_code, asyncio_frame.f_lineno, name)
    return Site(None, 0, name)


_tls = threading.local()


def _current_thread_name() -> str:
    # threading.current_thread() costs more than a thread-local read. A thread
    # renamed after its first capture keeps its old name here.
    try:
        name: str = _tls.name
    except AttributeError:
        name = _tls.name = threading.current_thread().name
    return name


def capture() -> Site:
    """The calling site, for bind records (runs on hot paths: keep it lean)."""
    frame, outermost = _first_outside(sys._getframe(1))
    name = _current_thread_name()
    if frame is None:
        return _fallback(outermost, name)
    return Site(frame.f_code, frame.f_lineno, name)


def capture_stack(limit: int = 4) -> tuple[Site, ...]:
    """Up to ``limit`` frames outside asyncio/the sanitizer, innermost first."""
    name = threading.current_thread().name
    frame, outermost = _first_outside(sys._getframe(1))
    if frame is None:
        return (_fallback(outermost, name),)
    sites: list[Site] = []
    while frame is not None and len(sites) < limit:
        sites.append(Site(frame.f_code, frame.f_lineno, name))
        frame = frame.f_back
        while frame is not None and _kind(frame.f_code) in (_ASYNCIO, _OWN):
            frame = frame.f_back
        if frame is not None and _kind(frame.f_code) == _BOUNDARY:
            break
    return tuple(sites)
