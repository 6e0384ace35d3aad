"""The serving process's threads as the kernel's scheduler saw them during a job.

Linux keeps, per thread (``/proc/<pid>/task/<tid>/schedstat`` and ``status``):

* time on a CPU, and how much of it in the kernel (system calls: ``epoll_wait``,
  a futex, a socket's send; in clock ticks, so meaningful over many requests);
* time *runnable but waiting for a CPU* (run-queue delay): the machine's cores were
  busy with other threads when this one could have run;
* voluntary context switches: the thread blocked (an ``epoll_wait``, a lock, a
  condition variable: a Python thread waiting for the GIL blocks on one);
* involuntary ones: the kernel preempted it.

A job's figures are the differences between a snapshot taken before it and one
after, grouped by thread name (Python's, for the threads of this process that
:func:`threading.enumerate` knows; ``main`` for another process's main thread;
``other`` for the rest: C threads such as ZMQ's, and a Python process's threads
that are not this one's).  These are what the stage probe cannot time: a wait
for the GIL between two Python threads of one process shows as more voluntary
switches, and a wait for a core as run-queue delay.

Invariants: a group's figures never go below zero (a thread counts from its first
snapshot, from zero when it started during the job); a thread that ended during
the job drops out with what it did; off Linux, or when the process is gone, a
snapshot is empty and a job has no figures (never zeros that look measured).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "FIELDS",
    "ThreadTimes",
    "job_threads",
    "named_threads",
    "per_request",
    "snapshot",
    "stat_fields",
    "thread_lines",
    "TICK_S",
]

#: Seconds per clock tick, the unit of ``/proc``'s ``utime`` and ``stime``.
TICK_S = 1 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

#: The order of a group's figures in ``latency.json``.
FIELDS = ("cpu_s", "wait_s", "voluntary", "involuntary", "sys_s")


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's counters (a snapshot), or a group's during a job (a difference)."""

    cpu_s: float = 0.0
    wait_s: float = 0.0
    voluntary: int = 0
    involuntary: int = 0
    sys_s: float = 0.0

    def __add__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(
            self.cpu_s + other.cpu_s,
            self.wait_s + other.wait_s,
            self.voluntary + other.voluntary,
            self.involuntary + other.involuntary,
            self.sys_s + other.sys_s,
        )

    def __sub__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(
            max(0.0, self.cpu_s - other.cpu_s),
            max(0.0, self.wait_s - other.wait_s),
            max(0, self.voluntary - other.voluntary),
            max(0, self.involuntary - other.involuntary),
            max(0.0, self.sys_s - other.sys_s),
        )

    def as_list(self) -> list[float]:
        return [
            self.cpu_s,
            self.wait_s,
            float(self.voluntary),
            float(self.involuntary),
            self.sys_s,
        ]


#: tid -> (group name, counters)
Snapshot = dict[int, tuple[str, ThreadTimes]]


def named_threads() -> dict[int, str]:
    """This process's Python threads by native id."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def snapshot(pid: int | None, names: dict[int, str] | None = None, root: str = "/proc") -> Snapshot:
    """Every thread of ``pid`` now; ``names``: group names by tid (default: none, the
    process's main thread is ``main``)."""
    if pid is None:
        return {}
    try:
        tids = [int(t.name) for t in (Path(root) / str(pid) / "task").iterdir() if t.name.isdigit()]
    except OSError:
        return {}
    out: Snapshot = {}
    for tid in tids:
        counters = _read(Path(root) / str(pid) / "task" / str(tid))
        if counters is not None:
            name = (names or {}).get(tid) or ("main" if tid == pid else "other")
            out[tid] = (name, counters)
    return out


def _read(task: Path) -> ThreadTimes | None:
    try:
        on_cpu_ns, waiting_ns, _slices = (task / "schedstat").read_text().split()[:3]
        status = (task / "status").read_text()
        sys_ticks = int(stat_fields((task / "stat").read_text())[12])
    except (OSError, ValueError, IndexError):
        return None  # ended since the listing, or no scheduler statistics here
    switches = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            switches[key] = int(value)
    return ThreadTimes(
        int(on_cpu_ns) / 1e9,
        int(waiting_ns) / 1e9,
        switches.get("voluntary_ctxt_switches", 0),
        switches.get("nonvoluntary_ctxt_switches", 0),
        sys_ticks * TICK_S,
    )


def stat_fields(stat: str) -> list[str]:
    """A ``/proc/.../stat`` line's fields after the command name, which may hold
    spaces and brackets: index 0 is the state, 11 ``utime``, 12 ``stime`` (in clock
    ticks: :data:`TICK_S`)."""
    return stat[stat.rindex(")") + 2 :].split()


def job_threads(before: Snapshot, after: Snapshot) -> dict[str, list[float]]:
    """Each group's figures between two snapshots, as ``latency.json`` holds them
    (:data:`FIELDS` in order); empty when either snapshot is."""
    if not before or not after:
        return {}
    groups: dict[str, ThreadTimes] = {}
    for tid, (name, now) in after.items():
        then = before.get(tid)
        spent = now - then[1] if then is not None else now
        groups[name] = groups.get(name, ThreadTimes()) + spent
    return {name: spent.as_list() for name, spent in sorted(groups.items())}


def per_request(jobs: list[tuple[dict[str, list[float]], int]]) -> dict[str, list[float]]:
    """Each group's figures per successful request, over ``(threads, ok)`` of the jobs
    that have figures (``{}`` when none has)."""
    measured = [(groups, ok) for groups, ok in jobs if groups]
    requests = sum(ok for _, ok in measured)
    if not requests:
        return {}
    total: dict[str, list[float]] = {}
    for groups, _ in measured:
        for name, figures in groups.items():
            seen = total.setdefault(name, [0.0] * len(FIELDS))
            total[name] = [a + b for a, b in zip(seen, figures)]
    return {name: [x / requests for x in figures] for name, figures in sorted(total.items())}


#: The table's busiest groups per row, by CPU, beside the whole process.
SHOWN = 3


def thread_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A table of the serving process's threads per request, after a blank line (none
    when no row has figures)."""
    measured = [r for r in rows if r.get("threads_per_request")]
    if not measured:
        return []
    lines = [
        "",
        "The serving process's threads per request (Linux's scheduler statistics): CPU ms",
        "(in brackets, of it in the kernel), ms runnable but waiting for a core, voluntary",
        "switches (blocked: I/O, a lock, the GIL), involuntary switches (preempted); the",
        "whole process, then its busiest threads:",
        "",
        "| scenario | mode | whole process | busiest threads |",
        "|---|---|---|---|",
    ]
    for r in measured:
        groups: dict[str, list[float]] = r["threads_per_request"]
        whole = [sum(xs) for xs in zip(*groups.values())]
        busiest = sorted(groups.items(), key=lambda kv: -kv[1][0])[:SHOWN]
        named = "; ".join(f"{name}: {_cell(xs)}" for name, xs in busiest)
        lines.append(f"| {r['scenario']} | {r['mode']} | {_cell(whole)} | {named} |")
    return lines


def _cell(figures: list[float]) -> str:
    cpu_s, wait_s, voluntary, involuntary, sys_s = figures
    return (
        f"{cpu_s * 1e3:.2f} ({sys_s * 1e3:.2f}) / {wait_s * 1e3:.2f} / {voluntary:.1f} / "
        f"{involuntary:.1f}"
    )
