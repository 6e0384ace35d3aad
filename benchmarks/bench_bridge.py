#!/usr/bin/env python
"""Micro-benchmarks: loopbridge beside the usual ways of crossing event loops.

One process run measures every scenario beside its baselines:

* loop-to-loop calls (a no-op method and a method that suspends once) at several
  concurrency levels, against ``asyncio.wrap_future(run_coroutine_threadsafe(...))``
  and the raw ``call_soon_threadsafe`` ping-pong (the floor);
* blocking calls from a plain thread, against ``run_coroutine_threadsafe(...).result()``
  and anyio's ``BlockingPortal``;
* streams, per item, with the credit window swept, against one
  ``run_coroutine_threadsafe`` hop per item, a ``call_soon_threadsafe(q.put_nowait)``
  queue, and janus / culsans queues;
* the same-loop fast path against a direct ``await``;
* ``--only threads`` (not run by default): throughput of 1, 2, 4... caller threads,
  each running its own loop of the same kind with 16 caller tasks, into the one
  owner loop (ratio: against one caller thread; below 1 is more throughput).
  Where it pays is a free-threaded Python with the GIL off (docs/free-threading.md).

Method: the owner loop runs on a background thread, the caller loop on the main
thread, both of the same kind (stock asyncio or uvloop).  Every repetition runs
every scenario once, in an order rotated by one per repetition; the first
repetition is a warm-up and is discarded.  A cell is the median over the
remaining repetitions; a ratio is the median of the per-repetition ratios
against the baseline measured in the same repetition.  Concurrency ``c`` means
``c`` worker tasks that each make ``calls / c`` calls back to back (persistent
workers, not one ``gather`` per batch).

Run ``python benchmarks/bench_bridge.py --quick`` for a run under a minute;
the default run takes a few minutes.  ``--pin`` keeps the process on one CPU:
on small VMs, cross-CPU wake-ups flip between a fast and a 3-4x slower mode for
seconds at a time, and pinning costs little because of the GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from loopbridge import LoopThread, adopt, blocking, proxy

perf = time.perf_counter
_END = object()


# ----------------------------------------------------------------- the target
class Service:
    """A plain class (not ours): declared loop-affine with ``adopt``, like AsyncLLM."""

    async def noop(self, i: int) -> int:
        return i

    async def yield1(self, i: int) -> int:
        await asyncio.sleep(0)
        return i

    async def count(self, n: int) -> Any:
        for i in range(n):
            yield i


async def _plain_noop(i: int) -> int:
    return i


async def _anext(agen: Any) -> Any:
    return await agen.__anext__()


# ---------------------------------------------------------------- environment
def _loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    if kind == "asyncio":
        return asyncio.new_event_loop
    raise ValueError(f"unknown loop kind {kind!r} (asyncio or uvloop)")


class Env:
    """An owner loop thread and a caller loop (main thread) of one kind."""

    def __init__(self, kind: str, windows: Sequence[int], count_wakes: bool = False) -> None:
        self.kind = kind
        factory = _loop_factory(kind)
        self.owner = LoopThread(f"bench-owner-{kind}", loop_factory=factory).start()
        self.A = self.owner.loop
        self.B = factory()
        self.obj = adopt(Service(), loop=self.A)
        self.p = proxy(self.obj)
        # eager=True: the first step runs before any task exists (see proxy()).
        self.pe = proxy(self.obj, eager=True)
        self.streams = {w: proxy(self.obj, stream_window=w) for w in windows}
        self.blocking = blocking(self.p)
        self.blocking_eager = blocking(self.pe)
        # An object owned by the caller loop itself: the same-loop fast path.
        self.local = adopt(Service(), loop=self.B)
        self.local_p = proxy(self.local)
        self._portal_cm: Any = None
        self.portal: Any = None
        self.wakes = {"owner": 0, "caller": 0}
        if count_wakes:
            self._count_wakes()

    def _count_wakes(self) -> None:
        # Diagnostic only (it adds a Python frame per wake-up): count the
        # self-pipe writes that wake each loop.  Stock asyncio only; uvloop's
        # wake-up is in C.
        if self.kind != "asyncio":
            return
        for side, loop in (("owner", self.A), ("caller", self.B)):
            write = loop._write_to_self  # type: ignore[attr-defined]

            def counted(side: str = side, write: Callable[[], None] = write) -> None:
                self.wakes[side] += 1
                write()

            loop._write_to_self = counted  # type: ignore[attr-defined]

    def start_portal(self) -> None:
        from anyio.from_thread import start_blocking_portal

        self._portal_cm = start_blocking_portal(
            "asyncio", backend_options={"use_uvloop": self.kind == "uvloop"}
        )
        self.portal = self._portal_cm.__enter__()

    def close(self) -> None:
        if self._portal_cm is not None:
            self._portal_cm.__exit__(None, None, None)
        self.owner.stop()
        self.B.run_until_complete(self.B.shutdown_asyncgens())
        self.B.close()


# ------------------------------------------------------------------ scenarios
# Each returns seconds per operation.
async def _workers(c: int, per: int, body: Callable[[int], Awaitable[None]]) -> float:
    t0 = perf()
    await asyncio.gather(*(body(per) for _ in range(c)))
    return (perf() - t0) / (c * per)


async def calls_loopbridge(env: Env, method: str, c: int, n: int, eager: bool = False) -> float:
    f = getattr(env.pe if eager else env.p, method)

    async def body(per: int) -> None:
        for i in range(per):
            await f(i)

    return await _workers(c, max(1, n // c), body)


async def calls_rct(env: Env, method: str, c: int, n: int) -> float:
    f = getattr(env.obj, method)
    A = env.A
    rct, wrap = asyncio.run_coroutine_threadsafe, asyncio.wrap_future

    async def body(per: int) -> None:
        for i in range(per):
            await wrap(rct(f(i), A))

    return await _workers(c, max(1, n // c), body)


async def calls_floor(env: Env, c: int, n: int) -> float:
    # B posts to A; A's callback posts fut.set_result back to B.  No Task, no method.
    A, B = env.A, env.B
    bounce = B.call_soon_threadsafe

    async def body(per: int) -> None:
        for _ in range(per):
            fut = B.create_future()
            A.call_soon_threadsafe(bounce, fut.set_result, None)
            await fut

    return await _workers(c, max(1, n // c), body)


def blocking_loopbridge(env: Env, n: int, eager: bool = False) -> float:
    f = (env.blocking_eager if eager else env.blocking).noop
    t0 = perf()
    for i in range(n):
        f(i)
    return (perf() - t0) / n


def blocking_rct(env: Env, n: int) -> float:
    f, A, rct = env.obj.noop, env.A, asyncio.run_coroutine_threadsafe
    t0 = perf()
    for i in range(n):
        rct(f(i), A).result()
    return (perf() - t0) / n


def blocking_anyio(env: Env, n: int) -> float:
    call = env.portal.call
    t0 = perf()
    for i in range(n):
        call(_plain_noop, i)
    return (perf() - t0) / n


def threads_loopbridge(env: Env, threads: int, c: int, n: int) -> float:
    """``threads`` caller threads, each its own loop with ``c`` tasks calling the
    owner loop; the wall time from a common start to the last one's end, per call."""
    per = max(1, n // (threads * c))
    p, factory = env.p, _loop_factory(env.kind)
    # The start is read by the barrier's action, before any thread is released: read
    # after wait() by this thread, it could come after a caller had already ended
    # (a negative sample on a loaded 2-core machine).
    starts: list[float] = []
    ready = threading.Barrier(threads + 1, action=lambda: starts.append(perf()))
    ends: list[float] = []

    async def body(count: int) -> None:
        for i in range(count):
            await p.noop(i)

    async def tasks() -> None:
        await asyncio.gather(*(body(per) for _ in range(c)))

    def caller() -> None:
        loop = factory()
        try:
            loop.run_until_complete(body(1))  # this loop's port, made before the start
            ready.wait()
            loop.run_until_complete(tasks())
            ends.append(perf())  # one list.append per thread: atomic with or without the GIL
        finally:  # as asyncio.run ends: its port's keeper is cancelled, then the loop closed
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    for w in workers:
        w.join()
    return (max(ends) - starts[0]) / (threads * c * per)


async def stream_loopbridge(env: Env, window: int, n: int) -> float:
    got = 0
    t0 = perf()
    async for _ in env.streams[window].count(n):
        got += 1
    dt = perf() - t0
    assert got == n, (got, n)
    return dt / n


async def stream_perhop(env: Env, n: int) -> float:
    agen = env.obj.count(n)
    A, rct, wrap = env.A, asyncio.run_coroutine_threadsafe, asyncio.wrap_future
    got = 0
    t0 = perf()
    while True:
        try:
            await wrap(rct(_anext(agen), A))
        except StopAsyncIteration:
            break
        got += 1
    dt = perf() - t0
    assert got == n, (got, n)
    return dt / n


async def stream_queue(env: Env, n: int) -> float:
    # The common pattern: the producer posts every item, with no back-pressure.
    B = env.B
    q: asyncio.Queue[Any] = asyncio.Queue()
    obj = env.obj

    async def produce() -> None:
        post, put = B.call_soon_threadsafe, q.put_nowait
        async for x in obj.count(n):
            post(put, x)
        post(put, _END)

    t0 = perf()
    done = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(produce(), env.A))
    got = 0
    get = q.get
    while (await get()) is not _END:
        got += 1
    await done
    dt = perf() - t0
    assert got == n, (got, n)
    return dt / n


async def stream_janus(env: Env, n: int, maxsize: int) -> float:
    # janus binds its async side to one loop: the producer on the owner loop uses
    # the sync side, which blocks the owner's thread while the queue is full.
    import janus

    jq: Any = janus.Queue(maxsize=maxsize)
    obj = env.obj

    async def produce() -> None:
        put = jq.sync_q.put
        async for x in obj.count(n):
            put(x)
        put(_END)

    t0 = perf()
    done = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(produce(), env.A))
    got = 0
    get = jq.async_q.get
    while (await get()) is not _END:
        got += 1
    await done
    dt = perf() - t0
    jq.close()
    await jq.wait_closed()
    assert got == n, (got, n)
    return dt / n


async def stream_culsans(env: Env, n: int, maxsize: int) -> float:
    # culsans' async side works from any loop: both ends await.
    import culsans

    cq: Any = culsans.Queue(maxsize=maxsize)
    obj = env.obj

    async def produce() -> None:
        put = cq.async_q.put
        async for x in obj.count(n):
            await put(x)
        await put(_END)

    t0 = perf()
    done = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(produce(), env.A))
    got = 0
    get = cq.async_q.get
    while (await get()) is not _END:
        got += 1
    await done
    dt = perf() - t0
    assert got == n, (got, n)
    return dt / n


async def same_loop_direct(env: Env, n: int) -> float:
    f = env.local.noop
    t0 = perf()
    for i in range(n):
        await f(i)
    return (perf() - t0) / n


async def same_loop_proxy(env: Env, n: int) -> float:
    f = env.local_p.noop
    t0 = perf()
    for i in range(n):
        await f(i)
    return (perf() - t0) / n


# ------------------------------------------------------------------ the plan
@dataclass
class Scenario:
    key: str  # unique: loop/group/name/params
    group: str  # calls, blocking, streams, same-loop
    loop: str
    name: str
    run: Callable[[], float]
    baseline: str | None = None  # key of the scenario it is divided by
    params: dict[str, Any] = field(default_factory=dict)
    ops: int = 0  # operations per run (for wake-ups per operation)


@dataclass
class Sizes:
    calls: int
    blocking_calls: int
    stream_items: int
    perhop_items: int
    same_loop_calls: int
    concurrency: list[int]
    windows: list[int]
    queue_size: int
    caller_threads: list[int] = field(default_factory=lambda: [1, 2, 4])


def _on(env: Env, make: Callable[[], Awaitable[float]]) -> Callable[[], float]:
    def run() -> float:
        return env.B.run_until_complete(make())

    return run


def plan(envs: Sequence[Env], sizes: Sizes, groups: set[str]) -> list[Scenario]:
    out: list[Scenario] = []
    for env in envs:
        lk = env.kind

        def add(
            key: str,
            group: str,
            name: str,
            run: Callable[[], float],
            baseline: str | None = None,
            lk: str = lk,
            **params: Any,
        ) -> str:
            full = f"{lk}/{group}/{key}"
            out.append(Scenario(full, group, lk, name, run, baseline, params))
            return full

        if "calls" in groups:
            for method in ("noop", "yield1"):
                for c in sizes.concurrency:
                    n = sizes.calls
                    base = add(
                        f"{method}/c{c}/rct",
                        "calls",
                        "rct",
                        _on(env, partial(calls_rct, env, method, c, n)),
                        None,
                        method=method,
                        c=c,
                    )
                    add(
                        f"{method}/c{c}/loopbridge",
                        "calls",
                        "loopbridge",
                        _on(env, partial(calls_loopbridge, env, method, c, n)),
                        base,
                        method=method,
                        c=c,
                    )
                    add(
                        f"{method}/c{c}/loopbridge-eager",
                        "calls",
                        "loopbridge-eager",
                        _on(env, partial(calls_loopbridge, env, method, c, n, True)),
                        base,
                        method=method,
                        c=c,
                    )
                    if method == "noop":
                        add(
                            f"{method}/c{c}/floor",
                            "calls",
                            "floor",
                            _on(env, partial(calls_floor, env, c, n)),
                            base,
                            method=method,
                            c=c,
                        )
        if "blocking" in groups:
            n = sizes.blocking_calls
            base = add("rct", "blocking", "rct", partial(blocking_rct, env, n))
            add("loopbridge", "blocking", "loopbridge", partial(blocking_loopbridge, env, n), base)
            add(
                "loopbridge-eager",
                "blocking",
                "loopbridge-eager",
                partial(blocking_loopbridge, env, n, True),
                base,
            )
            add("anyio", "blocking", "anyio-portal", partial(blocking_anyio, env, n), base)
        if "streams" in groups:
            qs, n = sizes.queue_size, sizes.stream_items
            base = add(
                "perhop",
                "streams",
                "perhop",
                _on(env, partial(stream_perhop, env, sizes.perhop_items)),
            )
            add("queue", "streams", "queue", _on(env, partial(stream_queue, env, n)), base)
            add(
                "janus",
                "streams",
                f"janus-{qs}",
                _on(env, partial(stream_janus, env, n, qs)),
                base,
                maxsize=qs,
            )
            add(
                "culsans",
                "streams",
                f"culsans-{qs}",
                _on(env, partial(stream_culsans, env, n, qs)),
                base,
                maxsize=qs,
            )
            for w in sizes.windows:
                add(
                    f"w{w}",
                    "streams",
                    f"loopbridge-w{w}",
                    _on(env, partial(stream_loopbridge, env, w, n)),
                    base,
                    window=w,
                )
        if "threads" in groups:
            base = None
            for t in sizes.caller_threads:
                key = add(
                    f"t{t}",
                    "threads",
                    f"threads-{t}",
                    partial(threads_loopbridge, env, t, THREAD_TASKS, sizes.calls),
                    base,
                    threads=t,
                )
                base = base or key
        if "same-loop" in groups:
            n = sizes.same_loop_calls
            base = add("direct", "same-loop", "direct", _on(env, partial(same_loop_direct, env, n)))
            add("proxy", "same-loop", "proxy", _on(env, partial(same_loop_proxy, env, n)), base)
    for sc in out:
        sc.ops = _ops(sc, sizes)
    return out


def _ops(sc: Scenario, sizes: Sizes) -> int:
    if sc.group == "calls":
        c = int(sc.params["c"])
        return max(1, sizes.calls // c) * c
    if sc.group == "blocking":
        return sizes.blocking_calls
    if sc.group == "streams":
        return sizes.perhop_items if sc.name == "perhop" else sizes.stream_items
    if sc.group == "threads":
        t = int(sc.params["threads"])
        return max(1, sizes.calls // (t * THREAD_TASKS)) * t * THREAD_TASKS
    return sizes.same_loop_calls


def measure(
    scenarios: list[Scenario],
    reps: int,
    warmup: int,
    progress: Callable[[str], None],
    envs: Sequence[Env] = (),
    wakes: dict[str, list[tuple[int, int]]] | None = None,
) -> dict[str, list[float]]:
    """Run every scenario once per repetition in rotated order; drop the warm-ups."""
    samples: dict[str, list[float]] = {s.key: [] for s in scenarios}
    env_of = {e.kind: e for e in envs}
    total = reps + warmup
    for r in range(total):
        k = r % len(scenarios)
        order = scenarios[k:] + scenarios[:k]
        for s in order:
            gc.collect()
            env = env_of.get(s.loop)
            before = dict(env.wakes) if env is not None else None
            value = s.run()
            if r >= warmup:
                samples[s.key].append(value)
                if wakes is not None and env is not None and before is not None:
                    wakes.setdefault(s.key, []).append(
                        (
                            env.wakes["owner"] - before["owner"],
                            env.wakes["caller"] - before["caller"],
                        )
                    )
        progress(f"repetition {r + 1}/{total}{' (warm-up)' if r < warmup else ''} done")
    return samples


# ----------------------------------------------------------------- reporting
#: Targets (median ratio or added µs) from the project's performance goals.
TARGETS: dict[str, tuple[str, float]] = {
    "calls/noop/c1": ("ratio", 0.6),
    "calls/noop/c16": ("ratio", 0.2),
    "calls/noop/c64": ("ratio", 0.15),
    "calls/yield1/c1": ("ratio", 0.7),
    "calls/yield1/c64": ("ratio", 0.3),
    "blocking": ("ratio", 0.6),
    "streams/w256": ("ratio", 0.007),
    "same-loop": ("added_us", 0.1),
}


def summarize(
    scenarios: list[Scenario],
    samples: dict[str, list[float]],
    wakes: dict[str, list[tuple[int, int]]] | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for s in scenarios:
        xs = samples[s.key]
        row: dict[str, Any] = {
            "key": s.key,
            "group": s.group,
            "loop": s.loop,
            "name": s.name,
            **s.params,
            "median_us": statistics.median(xs) * 1e6,
            "samples_us": [x * 1e6 for x in xs],
            "baseline": s.baseline if s.baseline in samples else None,
        }
        if s.baseline is not None and s.baseline in samples:
            base = samples[s.baseline]
            ratios = [a / b for a, b in zip(xs, base)]
            row["ratio"] = statistics.median(ratios)
            row["ratio_samples"] = ratios
            row["added_us"] = statistics.median([(a - b) * 1e6 for a, b in zip(xs, base)])
        if wakes and wakes.get(s.key) and s.ops:
            row["owner_wakes_per_op"] = statistics.median(w[0] / s.ops for w in wakes[s.key])
            row["caller_wakes_per_op"] = statistics.median(w[1] / s.ops for w in wakes[s.key])
        rows.append(row)
    return rows


def check_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        if row["name"] not in ("loopbridge", "loopbridge-eager", "proxy") and not row[
            "name"
        ].startswith("loopbridge-w"):
            continue
        key = (
            row["key"].split("/", 1)[1].rsplit("/", 1)[0]
            if row["group"] != "streams"
            else row["key"].split("/", 1)[1]
        )
        if row["group"] in ("blocking", "same-loop"):
            key = row["group"]
        target = TARGETS.get(key)
        if target is None:
            continue
        metric, limit = target
        if metric not in row:  # its baseline was not run (--match)
            continue
        value = row[metric]
        what = key + (" (eager)" if row["name"] == "loopbridge-eager" else "")
        out.append(
            {
                "loop": row["loop"],
                "what": what,
                "metric": metric,
                "value": value,
                "target": limit,
                "met": value <= limit,
            }
        )
    return out


def _cell(row: dict[str, Any] | None, ratio: bool = True) -> str:
    if row is None:
        return "-"
    us = row["median_us"]
    text = f"{us:.3g}" if us < 1 else f"{us:.1f}"
    if ratio and "ratio" in row:
        text += f" ({row['ratio']:.3g}x)"
    return text


def markdown(
    rows: list[dict[str, Any]], targets: list[dict[str, Any]], meta: dict[str, Any]
) -> str:
    by = {r["key"]: r for r in rows}
    loops = sorted({r["loop"] for r in rows}, key=lambda k: (k != "asyncio", k))
    lines: list[str] = []
    reps = meta["reps"]
    clock = "CPU µs (process time)" if meta.get("clock") == "cpu" else "µs"
    lines.append(
        f"Median {clock} per operation over {reps} repetitions (ratio: median of per-repetition ratios to the baseline)."
    )
    lines.append("")
    calls = [r for r in rows if r["group"] == "calls" and r["name"] == "rct"]
    if calls:
        lines += [
            "### Loop-to-loop calls (ratio vs `wrap_future(run_coroutine_threadsafe(...))`)",
            "",
        ]
        lines += [
            "| loop | method | c | rct | floor | loopbridge | loopbridge `eager=True` |",
            "|---|---|---|---|---|---|---|",
        ]
        for lk in loops:
            for r in calls:
                if r["loop"] != lk:
                    continue
                pre = r["key"].rsplit("/", 1)[0]
                lines.append(
                    f"| {lk} | {r['method']} | {r['c']} | {_cell(r)} | {_cell(by.get(pre + '/floor'))} | {_cell(by.get(pre + '/loopbridge'))} | {_cell(by.get(pre + '/loopbridge-eager'))} |"
                )
        lines.append("")
    if any(r["group"] == "blocking" for r in rows):
        lines += [
            "### Blocking calls from a plain thread (ratio vs `run_coroutine_threadsafe(...).result()`)",
            "",
        ]
        lines += [
            "| loop | rct `.result()` | loopbridge `blocking()` | `blocking()`, `eager=True` | anyio `BlockingPortal.call` |",
            "|---|---|---|---|---|",
        ]
        for lk in loops:
            if f"{lk}/blocking/rct" in by:
                lines.append(
                    f"| {lk} | {_cell(by[lk + '/blocking/rct'])} | {_cell(by[lk + '/blocking/loopbridge'])} | {_cell(by.get(lk + '/blocking/loopbridge-eager'))} | {_cell(by.get(lk + '/blocking/anyio'))} |"
                )
        lines.append("")
    srows = [r for r in rows if r["group"] == "streams"]
    if srows:
        names = list(dict.fromkeys(r["name"] for r in srows))
        lines += [
            "### Streams, µs per item (ratio vs one `run_coroutine_threadsafe` hop per item)",
            "",
        ]
        lines += ["| loop | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for lk in loops:
            cells = []
            for n in names:
                match = [r for r in srows if r["loop"] == lk and r["name"] == n]
                cells.append(_cell(match[0] if match else None))
            lines.append(f"| {lk} | " + " | ".join(cells) + " |")
        lines.append("")
    if any(r["group"] == "same-loop" for r in rows):
        lines += ["### Same-loop fast path (owner loop == running loop), no-op method", ""]
        lines += [
            "| loop | direct `await` µs | through the proxy µs | added µs |",
            "|---|---|---|---|",
        ]
        for lk in loops:
            d, p = by.get(f"{lk}/same-loop/direct"), by.get(f"{lk}/same-loop/proxy")
            if d and p:
                lines.append(
                    f"| {lk} | {d['median_us']:.3f} | {p['median_us']:.3f} | {p['added_us']:+.3f} |"
                )
        lines.append("")
    trows = [r for r in rows if r["group"] == "threads"]
    if trows:
        lines += [
            f"### Caller threads into one owner loop, {THREAD_TASKS} tasks each (ratio vs one thread)",
            "",
            "| loop | threads | µs per call (ratio) | calls per second |",
            "|---|---|---|---|",
        ]
        for r in trows:
            lines.append(
                f"| {r['loop']} | {r['threads']} | {_cell(r)} | {1e6 / r['median_us']:,.0f} |"
            )
        lines.append("")
    woken = [r for r in rows if "owner_wakes_per_op" in r]
    if woken:
        lines += [
            "### Wake-ups per operation (stock asyncio, `--count-wakes`; timings of that run carry the counting cost)",
            "",
        ]
        lines += [
            "| scenario | owner-loop wakes / op | caller-loop wakes / op | ops per owner wake |",
            "|---|---|---|---|",
        ]
        for r in woken:
            ow = r["owner_wakes_per_op"]
            lines.append(
                f"| {r['key']} | {ow:.3g} | {r['caller_wakes_per_op']:.3g} | {(1 / ow) if ow else float('inf'):.3g} |"
            )
        lines.append("")
    if targets:
        lines += [
            "### Targets",
            "",
            "| loop | case | measured | target | met |",
            "|---|---|---|---|---|",
        ]
        for t in targets:
            unit = "x" if t["metric"] == "ratio" else " µs"
            lines.append(
                f"| {t['loop']} | {t['what']} | {t['value']:.3g}{unit} | ≤ {t['target']}{unit} | {'yes' if t['met'] else '**no**'} |"
            )
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------ CLI
def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


GROUPS = ("calls", "blocking", "streams", "same-loop", "threads")
#: What a run without --only measures.
DEFAULT_GROUPS = ("calls", "blocking", "streams", "same-loop")
#: Caller tasks per caller thread in the threads group.
THREAD_TASKS = 16


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small sizes and 3 repetitions (< 1 min)")
    ap.add_argument("--reps", type=_positive, help="measured repetitions (default 7; quick 3)")
    ap.add_argument(
        "--warmup", type=int, default=1, help="discarded warm-up repetitions (default 1)"
    )
    ap.add_argument(
        "--calls", type=_positive, help="calls per measurement (default 10000; quick 2000)"
    )
    ap.add_argument(
        "--blocking-calls", type=_positive, help="blocking calls per measurement (default: --calls)"
    )
    ap.add_argument(
        "--stream-items", type=_positive, help="items per stream (default 100000; quick 20000)"
    )
    ap.add_argument(
        "--perhop-items",
        type=_positive,
        help="items for the one-hop-per-item baseline; its per-item cost does not depend on length (default 20000; quick 2000)",
    )
    ap.add_argument(
        "--same-loop-calls",
        type=_positive,
        help="calls for the same-loop case (default 200000; quick 50000)",
    )
    ap.add_argument(
        "--concurrency",
        type=_ints,
        default=[1, 16, 64],
        help="caller tasks, comma-separated (default 1,16,64)",
    )
    ap.add_argument(
        "--windows",
        type=_ints,
        default=[16, 256, 4096],
        help="stream credit windows (default 16,256,4096)",
    )
    ap.add_argument(
        "--queue-size",
        type=_positive,
        default=256,
        help="maxsize of the janus/culsans queues (default 256)",
    )
    ap.add_argument(
        "--loops",
        default="asyncio,uvloop",
        help="loop kinds, comma-separated (default asyncio,uvloop)",
    )
    ap.add_argument(
        "--only",
        default=",".join(DEFAULT_GROUPS),
        help=f"groups to run, comma-separated, of {','.join(GROUPS)} (default {','.join(DEFAULT_GROUPS)})",
    )
    ap.add_argument(
        "--caller-threads",
        type=_ints,
        default=[1, 2, 4],
        help="caller threads of the threads group, comma-separated (default 1,2,4; the first is the baseline)",
    )
    ap.add_argument(
        "--match",
        default=None,
        help="only scenarios whose key contains one of these comma-separated strings (for profiling; ratios need the baselines)",
    )
    ap.add_argument(
        "--count-wakes",
        action="store_true",
        help="count self-pipe wake-ups per operation (stock asyncio; diagnostic, slows the run a little)",
    )
    ap.add_argument(
        "--pin",
        nargs="?",
        const=-1,
        type=int,
        default=None,
        metavar="CPU",
        help="pin the process to one CPU (default: the first allowed)",
    )
    ap.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write results here (default: benchmarks/results/bench_bridge.json)",
    )
    ap.add_argument(
        "--markdown", type=Path, default=None, help="also write the Markdown table here"
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter (default); cpu: time.process_time, the CPU time of the "
        "whole process, which other processes' load does not inflate (use with --pin on a "
        "shared machine: pinned, the two threads' CPU time is the wall time of a quiet machine)",
    )
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    quick = args.quick
    args.reps = args.reps or (3 if quick else 7)
    args.calls = args.calls or (2000 if quick else 10000)
    args.blocking_calls = args.blocking_calls or args.calls
    args.stream_items = args.stream_items or (20000 if quick else 100000)
    args.perhop_items = args.perhop_items or (2000 if quick else 20000)
    args.same_loop_calls = args.same_loop_calls or (50000 if quick else 200000)
    args.loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    for lk in args.loops:
        _loop_factory(lk)
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    bad = args.only - set(GROUPS)
    if bad:
        ap.error(f"unknown group(s) {sorted(bad)}; choose from {GROUPS}")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    return args


def pin_cpu(cpu: int) -> int:
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[0] if cpu < 0 else cpu
    if chosen not in allowed:
        raise SystemExit(f"--pin {cpu}: CPU not available (allowed: {allowed})")
    os.sched_setaffinity(0, {chosen})
    return chosen


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    global perf
    perf = time.process_time if args.clock == "cpu" else time.perf_counter
    pinned = pin_cpu(args.pin) if args.pin is not None else None  # before any thread starts
    log: Callable[[str], None] = (
        (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    )
    sizes = Sizes(
        args.calls,
        args.blocking_calls,
        args.stream_items,
        args.perhop_items,
        args.same_loop_calls,
        args.concurrency,
        args.windows,
        args.queue_size,
        args.caller_threads,
    )
    envs = [Env(kind, args.windows, args.count_wakes) for kind in args.loops]
    wakes: dict[str, list[tuple[int, int]]] | None = {} if args.count_wakes else None
    try:
        if "blocking" in args.only:
            for env in envs:
                env.start_portal()
        scenarios = plan(envs, sizes, args.only)
        if args.match:
            wanted = [m for m in args.match.split(",") if m]
            scenarios = [s for s in scenarios if any(m in s.key for m in wanted)]
            if not scenarios:
                raise SystemExit(f"--match {args.match!r} selects no scenario")
        log(f"{len(scenarios)} scenarios x {args.reps + args.warmup} repetitions")
        t0 = time.perf_counter()
        samples = measure(scenarios, args.reps, args.warmup, log, envs, wakes)
        elapsed = time.perf_counter() - t0
    finally:
        for env in envs:
            env.close()
    rows = summarize(scenarios, samples, wakes)
    targets = check_targets(rows)
    meta = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "pinned_cpu": pinned,
        "clock": args.clock,
        "switch_interval_s": sys.getswitchinterval(),
        "versions": _versions(),
        "reps": args.reps,
        "warmup": args.warmup,
        "sizes": sizes.__dict__,
        "elapsed_s": elapsed,
        "argv": list(sys.argv[1:] if argv is None else argv),
    }
    result = {"meta": meta, "rows": rows, "targets": targets}
    table = markdown(rows, targets, meta)
    print(table)
    out = args.json or Path(__file__).resolve().parent / "results" / "bench_bridge.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if args.markdown is not None:
        args.markdown.write_text(table + "\n")
    log(f"wrote {out} ({elapsed:.0f} s measured)")
    return result


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("loopbridge", "uvloop", "anyio", "janus", "culsans"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


if __name__ == "__main__":
    main()
