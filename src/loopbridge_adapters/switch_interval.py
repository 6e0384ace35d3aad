"""The interpreter's switch interval while threaded servers serve.

A threaded server shares its process's GIL with the engine's owner loop and with
whatever else the process runs: in an RL actor, the actor's own pure-Python work.
A thread that wants the GIL waits until its holder blocks or, at the latest, for
the switch interval (``sys.setswitchinterval``; CPython's default is 5 ms). An
actor slice of 4 ms never reaches 5 ms, so the HTTP and owner threads waited for
whole slices; at 1 ms they wait at most about 1 ms. Measured (docs/dev/performance-history.md,
issue 36): with a busy actor, the streamed TTFT p99 at concurrency 16 fell by a
quarter to a third; with nothing else running, and at concurrency 64, no change
beyond the run-to-run spread.

Invariants:

* **Process-wide and counted.** The interval is one per process. The first server
  that serves with a setting saves the interval in force; while any such server
  serves, the interval is the one the latest of them set; when the last one
  stops, the saved interval comes back, unless the interval in force is no longer
  the one a server set (someone else changed it meanwhile): that one is kept, and
  the log says so.
* **Set on the server's own thread** when serving begins, and restored on every path
  that ends the serving (stop, a failed start, the watchdog), so a stopped server
  leaves nothing behind.
* ``None`` leaves the interval alone: nothing is saved, set or restored.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import sys
import threading
from collections.abc import Iterator

__all__ = [
    "DEFAULT_SWITCH_INTERVAL_S",
    "check_switch_interval",
    "parse_switch_interval_ms",
    "serving_switch_interval",
]

#: What a threaded server sets while it serves, unless told otherwise (seconds).
DEFAULT_SWITCH_INTERVAL_S = 0.001

_lock = threading.Lock()
_holders = 0  # the serving servers that set an interval
_saved = 0.0  # while any does: the interval in force before the first of them
_ours = 0.0  # ... and the interval the latest of them set


def check_switch_interval(seconds: float | None) -> float | None:
    """``seconds`` if it is a usable setting (a positive number or None), else ValueError."""
    usable = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0
    if seconds is not None and not usable:
        raise ValueError(
            f"switch_interval must be a positive number of seconds (the default "
            f"{DEFAULT_SWITCH_INTERVAL_S}) or None to leave the interpreter's alone, "
            f"not {seconds!r}"
        )
    return seconds


def parse_switch_interval_ms(text: str) -> float | None:
    """A command line's ``--switch-interval-ms``: a positive number of ms, or ``off`` (None)."""
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a positive number of ms or off, not {text!r}")
    return value


@contextlib.contextmanager
def serving_switch_interval(
    seconds: float | None, logger: logging.Logger, kind: str
) -> Iterator[None]:
    """Hold the interpreter's switch interval at ``seconds`` for the ``with`` block."""
    if seconds is None:
        yield
        return
    _hold(seconds, logger, kind)
    try:
        yield
    finally:
        _let_go(logger, kind)


def _hold(seconds: float, logger: logging.Logger, kind: str) -> None:
    global _holders, _saved, _ours
    with _lock:
        before = sys.getswitchinterval()
        if not _holders:
            _saved = before
        _holders += 1
        sys.setswitchinterval(seconds)
        _ours = sys.getswitchinterval()
    logger.info(
        "%s: the interpreter's switch interval is %.3g ms while it serves (it was %.3g ms; "
        "switch_interval=None leaves it alone)",
        kind,
        seconds * 1e3,
        before * 1e3,
    )


def _let_go(logger: logging.Logger, kind: str) -> None:
    global _holders
    with _lock:
        _holders -= 1
        if _holders:
            return  # another server still serves with it
        now = sys.getswitchinterval()
        if not math.isclose(now, _ours, abs_tol=1e-7):
            logger.warning(
                "%s: the switch interval was changed to %.3g ms while serving; left at that, "
                "not restored to %.3g ms",
                kind,
                now * 1e3,
                _saved * 1e3,
            )
            return
        sys.setswitchinterval(_saved)
