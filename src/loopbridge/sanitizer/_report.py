"""What the sanitizer says when it finds a misuse, and how it says it.

A report names both sides of the misuse: the offending call (site, thread,
the loop that thread runs) and the owner (the loop the object belongs to, the
thread running it, and where the object or its waiter was bound).
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from ._sites import Site

Policy = Literal["raise", "warn", "log", "off"]
POLICIES: tuple[Policy, ...] = ("raise", "warn", "log", "off")

Kind = Literal["wrong-thread", "wrong-loop"]

logger = logging.getLogger("loopbridge.sanitizer")


class SanitizerError(RuntimeError):
    """An asyncio object was used from a thread or loop that does not own it.

    Raised under the ``raise`` policy, in the offending thread, *before* the
    operation runs, so the object is left untouched; a cross-loop wake of another
    running loop's waiters is raised in those waiters instead, and not done (see
    :mod:`loopbridge.sanitizer._instrument`). ``report`` has the details.
    It pickles with its report (see :class:`Site` for the code objects).
    """

    def __init__(self, report: SanitizerReport) -> None:
        super().__init__(report.message())
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's would call the class with the message, not the report.
        return type(self), (self.report,), self.__dict__


class SanitizerWarning(RuntimeWarning):
    """Issued once per offending call site under the ``warn`` policy."""


@dataclass(frozen=True)
class SanitizerReport:
    """One misuse: who called, from where, and who owns the object."""

    operation: str
    """The call that was made, e.g. ``asyncio.Event.set``."""
    kind: Kind
    """``wrong-thread``: a thread running no loop touched an object whose loop
    runs elsewhere. ``wrong-loop``: code on one loop touched an object (or woke
    a waiter) that belongs to another loop."""
    subject: str
    call_stack: tuple[Site, ...]
    """The offending call site first, then its callers (asyncio frames left out)."""
    call_loop: str
    owner_loop: str
    owner_thread: str | None
    """Thread running the owner loop at the time, ``None`` if it was not running
    or (uvloop) the loop does not say."""
    bind: Site | None
    """Where the object was bound to its loop: a future/task's creation, a
    primitive's first waiter, or a primitive's first use on a loop."""
    bind_how: str
    waiters: tuple[str, ...]

    @property
    def call_site(self) -> Site:
        return self.call_stack[0]

    def key(self) -> str:
        """Reports are de-duplicated per offending line (one misuse often
        trips several nested checks on the same line)."""
        return self.call_site.where()

    def message(self) -> str:
        site = self.call_site
        what = "thread" if self.kind == "wrong-thread" else "loop"
        owner = self.owner_loop
        if self.owner_thread is not None:
            owner += f", running in thread {self.owner_thread!r}"
        lines = [
            f"loopbridge sanitizer: {self.operation}() called from the wrong {what}",
            f"  call:  {site.where()} [thread {site.thread!r}, {self.call_loop}]",
        ]
        lines += [f"         called from {s.where()}" for s in self.call_stack[1:]]
        lines.append(f"  owner: {self.subject} belongs to {owner}")
        if self.bind is not None:
            lines.append(f"  bound: {self.bind} ({self.bind_how})")
        lines += [f"  waiter: {w}" for w in self.waiters]
        lines.append(
            "  Reach the owner loop with loop.call_soon_threadsafe(), "
            "asyncio.run_coroutine_threadsafe() or loopbridge.proxy()."
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.message()


class Collector:
    """Receives every report made while its ``sanitize()`` block is innermost."""

    def __init__(self) -> None:
        self.reports: list[SanitizerReport] = []


class _Emitter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.policy: Policy = "off"
        self.seen: dict[str, int] = {}
        self.collectors: list[Collector] = []

    def contain(self, report: SanitizerReport) -> bool:
        """A misuse seen only on the owner's side (a cross-loop wake): under "raise",
        record and log it without raising and return True (the caller fails the
        waiters instead); under any other policy :meth:`emit` it, return False."""
        with self.lock:
            policy = self.policy
            if policy == "raise":
                if self.collectors:
                    self.collectors[-1].reports.append(report)
                count = self.seen.get(report.key(), 0) + 1
                self.seen[report.key()] = count
        if policy != "raise":
            self.emit(report)
            return False
        if count > 1:
            logger.debug(
                "%s() misuse again at %s (%d times)",
                report.operation,
                report.call_site.where(),
                count,
            )
            return True
        logger.error(
            "%s\n  Not raised here (the loop that woke the waiter goes on); each waiter "
            "fails with it instead.",
            report.message(),
        )
        return True

    def emit(self, report: SanitizerReport) -> None:
        with self.lock:
            policy = self.policy
            if self.collectors:
                self.collectors[-1].reports.append(report)
            if policy == "raise":
                count = 0
            else:  # "once per site" counts what was warned or logged
                count = self.seen.get(report.key(), 0) + 1
                self.seen[report.key()] = count
        if policy == "raise":
            raise SanitizerError(report)
        if count > 1:
            if policy == "log":
                logger.debug(
                    "%s() misuse again at %s (%d times)",
                    report.operation,
                    report.call_site.where(),
                    count,
                )
            return
        if policy == "warn":
            site = report.call_site
            filename = site.code.co_filename if site.code is not None else "<unknown>"
            warning = SanitizerWarning(report.message())
            warnings.warn_explicit(warning, SanitizerWarning, filename, site.lineno)
        elif policy == "log":
            logger.error("%s", report.message())


emitter = _Emitter()
