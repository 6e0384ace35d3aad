"""Hang diagnosis: every cross-loop call and stream in flight, who waits on whom.

Each port already tracks the operations in flight towards its loop (to fail them
when the loop dies), so a dump only has to walk the ports: it costs nothing
until it is asked for.  The one thing the hot path cannot know for free is
*where* an operation was submitted; :func:`record_submission_sites` turns on a
cheap capture (one code location per call, no frame kept alive), off by default.

Everything here reads state owned by other threads without stopping them: the
numbers are a consistent-enough picture for a human, not a transaction.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import IO, Any, TypeVar

from ._compat import thread_id_of
from ._labels import thread_name
from ._ports import Port, live_ports

__all__ = [
    "SubmissionSites",
    "submission_site",
    "record_submission_sites",
    "dump_inflight",
    "format_inflight",
    "install_hang_dump",
]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ASYNCIO_DIR = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep
_ASYNCIO_EVENTS = os.path.abspath(asyncio.events.__file__)
T = TypeVar("T")


class SubmissionSites:
    """Whether calls and streams record where they were submitted (read by the
    core each time it creates one; set by :func:`record_submission_sites`)."""

    recording = os.environ.get("LOOPBRIDGE_RECORD_SITES", "") not in ("", "0")


def _where(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _outside(filename: str) -> bool:
    return (
        not filename.startswith(_PKG_DIR)
        and not filename.startswith(_ASYNCIO_DIR)
        and not filename.startswith("<loopbridge ")  # generated wrappers (_codegen)
    )


def submission_site() -> str | None:
    """The first frame outside loopbridge and asyncio that led here, as
    ``file:line in func``.

    A proxy call wrapped in its own task (``create_task(p.method())``) has no
    such frame: its coroutine starts from the loop.  Then the site where the
    coroutine was created is used if the caller's loop records it (asyncio
    debug mode does), else the task is named.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename == _ASYNCIO_EVENTS:  # a task step: the loop, not a caller
            break
        if _outside(filename):
            return _where(frame)
        frame = frame.f_back
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no asyncio loop here (trio, plain thread)
        return None
    if task is None:
        return None
    origin = getattr(task.get_coro(), "cr_origin", None) or ()
    for filename, lineno, funcname in origin:
        if _outside(filename):
            return f"{filename}:{lineno} in {funcname}"
    return f"task {task.get_name()!r} (created elsewhere)"


def record_submission_sites(enabled: bool = True) -> bool:
    """Record where each cross-loop call and stream is submitted, for dumps.

    Off by default: when on, creating a call costs about a microsecond more.
    Only operations submitted while it is on carry a site.  Returns the
    previous setting.  ``LOOPBRIDGE_RECORD_SITES=1`` turns it on at import.
    """
    old, SubmissionSites.recording = SubmissionSites.recording, bool(enabled)
    return old


# ------------------------------------------------------------------- dump
def _await_chain(awaitable: object, limit: int = 6) -> list[str]:
    """Where a suspended coroutine / async generator chain is, outermost first,
    without loopbridge's own frames."""
    out: list[str] = []
    seen = 0
    while awaitable is not None and seen < 64:
        seen += 1
        frame = (
            getattr(awaitable, "cr_frame", None)
            or getattr(awaitable, "ag_frame", None)
            or getattr(awaitable, "gi_frame", None)
        )
        if frame is not None and not frame.f_code.co_filename.startswith(_PKG_DIR):
            out.append(_where(frame))
        awaitable = (
            getattr(awaitable, "cr_await", None)
            or getattr(awaitable, "ag_await", None)
            or getattr(awaitable, "gi_yieldfrom", None)
        )
    return out[-limit:]


def _owner_thread(port: Port, frames: dict[int, FrameType]) -> tuple[str | None, str | None]:
    """Name of the thread running the port's loop, and where it is right now."""
    ident = thread_id_of(port.loop) or port.thread_id
    if ident is None:
        return None, None
    name = thread_name(ident)
    frame = frames.get(ident)
    return name, (_where(frame) if frame is not None else None)


def _snapshot(d: Iterable[T]) -> list[T]:
    while True:
        try:
            return list(d)
        except RuntimeError:  # pragma: no cover - resized by another thread meanwhile
            continue


def dump_inflight() -> list[dict[str, Any]]:
    """Every cross-loop call and stream in flight, longest waiting first.

    Each entry names both sides (``caller`` waits on ``owner``, with the owner
    loop's thread and where that thread is now), how long it has waited
    (``waiting_s``, and ``parked_s`` for a stream whose consumer waits for an
    item), where it was submitted (``submitted_at``, when
    :func:`record_submission_sites` is on) and where the owner side is suspended
    (``owner_at``, innermost last).
    """
    ports = live_ports()
    frames = sys._current_frames()
    now = time.perf_counter()
    out: list[dict[str, Any]] = []
    # In flight towards each loop, then callers parked on each loop whose
    # operation has left every in-flight set (settled, its wake not delivered yet).
    pairs = [(port, op) for port in ports for op in _snapshot(port.inflight)]
    listed = {id(op) for _, op in pairs}
    pairs += [
        (op.owner, op)
        for port in ports
        for op in _snapshot(port.waiting)
        if id(op) not in listed and op.owner is not None and not op.waiter.done()
    ]
    for port, op in pairs:
        owner_thread, owner_thread_at = _owner_thread(port, frames)
        entry = op.describe()
        entry["owner_thread"] = owner_thread
        entry["owner_thread_at"] = owner_thread_at
        entry["submitted_at"] = getattr(op, "site", None)
        if entry["kind"] == "stream":
            t_parked = getattr(op, "t_parked", 0.0)
            parked = entry.get("consumer_parked") and t_parked
            entry["parked_s"] = round(now - t_parked, 6) if parked else None
            agen = getattr(op, "agen", None)
            entry["owner_at"] = _await_chain(agen) if agen is not None else []
        else:
            task = getattr(op, "task", None)
            entry["owner_at"] = _await_chain(task.get_coro()) if task is not None else []
        out.append(entry)
    out.sort(key=lambda e: -float(e["waiting_s"]))
    return out


def format_inflight(entries: list[dict[str, Any]] | None = None) -> str:
    """:func:`dump_inflight` as text for a human (one block per operation)."""
    if entries is None:
        entries = dump_inflight()
    lines = [f"loopbridge: {len(entries)} cross-loop operation(s) in flight"]
    for e in entries:
        owner = e["owner"]
        if e.get("owner_thread"):
            owner = f"{owner} (thread {e['owner_thread']!r})"
        lines.append(f"{e['kind']} {e['what']}")
        lines.append(f"  {e['caller']} (thread {e['submitted_from_thread']!r}) waits on {owner}")
        state = f"  waiting {e['waiting_s']:.3f} s"
        if e.get("outcome", "pending") != "pending":
            state += f", settled ({e['outcome']}) but the caller is not woken yet"
        elif e["kind"] == "call":
            if e.get("running_s") is not None:
                state += f", running on the owner for {e['running_s']:.3f} s"
            else:
                state += ", not started on the owner yet (owner loop busy or blocked?)"
            if e.get("cancel_requested"):
                state += ", cancel requested"
        else:
            if e.get("parked_s") is not None:
                state += f", consumer parked for {e['parked_s']:.3f} s"
            state += f", {e['buffered']} item(s) buffered"
            if e.get("producer_parked"):
                state += ", producer waits for the consumer (window full)"
        lines.append(state)
        lines.append(
            f"  submitted at {e['submitted_at'] or '? (record_submission_sites() was off)'}"
        )
        for i, where in enumerate(e["owner_at"]):
            lines.append(f"  {'owner side at' if i == 0 else '          then'} {where}")
        if e.get("owner_thread_at"):
            lines.append(f"  owner thread now at {e['owner_thread_at']}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------- signal hook
_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


def install_hang_dump(sig: int | None = None, *, file: IO[str] | None = None) -> _Handler:
    """Write :func:`format_inflight` to ``file`` (stderr) when ``sig`` arrives.

    ``sig`` defaults to ``SIGUSR1``: ``kill -USR1 <pid>`` then shows what a hung
    process waits on.  Also turns :func:`record_submission_sites` on.  Must be
    called from the main thread (Python runs signal handlers there); returns the
    previous handler so it can be restored with ``signal.signal``.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "install_hang_dump() must be called from the main thread: "
            "Python installs and runs signal handlers there"
        )
    if sig is None:
        sig = getattr(signal, "SIGUSR1", None)
        if sig is None:  # pragma: no cover - Windows
            raise ValueError("this platform has no SIGUSR1: pass the signal to use")

    def handler(signum: int, frame: FrameType | None) -> None:
        out = file if file is not None else sys.stderr
        out.write(format_inflight())
        out.flush()

    previous = signal.signal(sig, handler)
    record_submission_sites(True)
    return previous
