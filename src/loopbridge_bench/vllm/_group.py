"""A child process group that dies with the process that started it (Linux).

``vllm serve`` spawns an EngineCore of its own; if the benchmark is killed
(``SIGKILL``, an OOM kill, a closed terminal), nothing would stop either of them.
:func:`spawn_group` starts this file as a small guardian, leader of a new process
group (session), which runs the command as its child in that group:

* the guardian asks the kernel for ``SIGTERM`` when its parent dies
  (``PR_SET_PDEATHSIG``), then checks that its parent is still the one that
  started it (it may have died before the request);
* ``SIGTERM``, ``SIGINT`` or ``SIGHUP`` (the parent's stop, or its death): passed
  on to the command for its own clean shutdown; after the grace period, or as
  soon as the command has exited, ``SIGKILL`` to the rest of the group (the
  command's children, whatever they do with signals);
* the command's own exit: ``SIGKILL`` to the rest of the group, then the guardian
  exits with the command's status (128 + N for signal N, as a shell reports it).

It is run by path, not as a module, so that it imports nothing but the standard
library: it is up at once and needs no environment of its own.  The kernel
sends ``PR_SET_PDEATHSIG`` when the *thread* that forked the guardian ends, so
:func:`spawn_group` belongs on a thread that lives as long as the group should
(the benchmark's main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["group_members", "parent_of", "spawn_group"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def spawn_group(
    command: Sequence[str],
    *,
    env: dict[str, str],
    stdout: IO[bytes] | int,
    grace_s: float = 25.0,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a new process group that dies with this process.

    Returns the guardian's ``Popen``: its pid is the group's id; signal it (not
    the group) for a clean stop, ``os.killpg`` it for a hard one.
    """
    return subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(os.getpid()), str(grace_s), "--", *command],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def parent_of(pid: int) -> int | None:
    """``pid``'s parent (Linux ``/proc``), or ``None`` if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def group_members(pgid: int) -> list[int]:
    """The pids in process group ``pgid``, leader first (Linux ``/proc``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    found.append(int(entry))
            except OSError:
                pass  # gone, or not ours to see
    return sorted(found, key=lambda pid: pid != pgid)


class _Stop(Exception):
    pass


def _stop(signum: int, frame: Any) -> None:
    raise _Stop(signum)


def _kill_rest_of_group() -> None:
    me = os.getpid()
    for pid in group_members(os.getpgid(0)):
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _status(returncode: int) -> int:
    """A shell's exit status: 128 + N for a command ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _guard(parent: int, grace_s: float, command: list[str]) -> int:
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _stop)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    child = None
    try:
        if os.getppid() != parent:  # the parent died before the request took effect
            return 128 + signal.SIGTERM
        child = subprocess.Popen(command)
        return _status(child.wait())
    except _Stop:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # one stop is enough
        if child is None:
            return 128 + signal.SIGTERM
        try:
            child.send_signal(signal.SIGTERM)  # the command's own clean shutdown
            return _status(child.wait(grace_s))
        except subprocess.TimeoutExpired:
            return 128 + signal.SIGKILL
    finally:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        _kill_rest_of_group()
        if child is not None and child.poll() is None:
            child.wait()


if __name__ == "__main__":
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit("usage: _group.py PARENT_PID GRACE_S -- COMMAND...")
    sys.exit(_guard(int(sys.argv[1]), float(sys.argv[2]), sys.argv[4:]))
