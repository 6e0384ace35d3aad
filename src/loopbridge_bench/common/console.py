"""Where the benchmark's output goes: the report to the terminal, the logs to files.

Engines and servers log a great deal (vLLM's start-up warnings, uvicorn, the
unsafe mode's intended crash); on the terminal that hides the report, and an
expected crash reads like a real one.  Inside ``with Console(log_dir)``, file
descriptors 1 and 2 of this process point at the current phase's log,
``<log_dir>/<phase>.log``, so that every writer reaches it: Python's logging and
warnings, C extensions, and the child processes spawned during the phase (an
EngineCore inherits the descriptors it was started with, so its log stays in the
file of the phase that started it).  The report reaches the terminal through
duplicates of the original descriptors: :attr:`Console.out` and :attr:`Console.err`.

Invariants: outside the ``with`` block descriptors 1 and 2 are the caller's
again; an exception leaving the block (but Ctrl-C) is preceded on the terminal by the last
lines of the phase's log (an engine's root cause is often only there); a phase
log still empty at the end is removed.  ``Console(None)`` changes nothing (``--show-logs``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["Console", "tail"]

#: Log lines shown on the terminal with an unexpected failure.
TAIL_LINES = 30


def tail(path: Path | None, n: int = TAIL_LINES) -> list[str]:
    """The last ``n`` non-blank lines of ``path`` (none if it does not exist)."""
    if path is None:
        return []
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-n:]


class Console:
    """Routes descriptors 1 and 2 to per-phase log files; see the module docstring."""

    def __init__(self, log_dir: Path | None) -> None:
        self.log_dir = log_dir
        self.out: IO[str] = sys.stdout
        self.err: IO[str] = sys.stderr
        self.current: Path | None = None  # the phase's log file
        self.logs: list[Path] = []  # every phase log, in order
        self._saved: tuple[int, int] | None = None

    def __enter__(self) -> Console:
        if self.log_dir is None:
            return self
        self.log_dir.mkdir(parents=True, exist_ok=True)
        _flush()
        self._saved = (os.dup(1), os.dup(2))
        enc = [getattr(s, "encoding", None) or "utf-8" for s in (sys.stdout, sys.stderr)]
        self.out = open(os.dup(self._saved[0]), "w", buffering=1, encoding=enc[0], errors="replace")
        self.err = open(os.dup(self._saved[1]), "w", buffering=1, encoding=enc[1], errors="replace")
        return self

    def phase(self, name: str) -> Path | None:
        """Send everything written from now on (by this process and its new children) to
        ``<log_dir>/<name>.log``; its path, or ``None`` when logs stay on the terminal."""
        if self._saved is None or self.log_dir is None:
            return None
        path = self.log_dir / f"{name}.log"
        _flush()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        finally:
            os.close(fd)
        self.current = path
        if path not in self.logs:
            self.logs.append(path)
        return path

    def add(self, path: Path) -> None:
        """Count ``path`` (a child process's own log) among the run's logs."""
        if path not in self.logs:
            self.logs.append(path)

    def say(self, text: str) -> None:
        """One line for the terminal's error stream (progress notes, warnings)."""
        print(text, file=self.err, flush=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._saved is None:
            return
        _flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._saved = None
        # The traceback itself follows from the interpreter, on the restored stderr.
        failed = exc is not None and not isinstance(exc, KeyboardInterrupt)
        lines = tail(self.current) if failed else []
        if lines:
            self.say(f"bench: failed; the last {len(lines)} lines of {self.current}:")
            for line in lines:
                self.say(f"  | {line}")
        self.out.close()
        self.err.close()
        self.out, self.err = sys.stdout, sys.stderr
        for path in self.logs:  # the children that wrote to them are gone by now
            try:
                if path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                pass
        self.logs = [p for p in self.logs if p.exists()]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
