#!/usr/bin/env python
"""Throughput of the database and cache recipes (docs/recipes.md) against a per-call
``run_coroutine_threadsafe`` wrapper, on real PostgreSQL and Redis servers.

The client lives on an owner loop (a ``LoopThread``). Two kinds of callers use it:

* ``loop``: an asyncio loop on the main thread, ``--concurrency`` tasks making
  calls back to back;
* ``threads``: ``--concurrency`` plain threads (a threaded web server's workers).

Each operation is measured three ways in the same repetition:

* ``loopbridge``: the recipe's own function through the proxy (for a unit such as
  acquire + transaction + query, every step is one crossing);
* ``rcts``: the usual hand-written wrapper, one ``run_coroutine_threadsafe`` hop
  per call of the same operation, with the unit written as one coroutine on the
  raw client (so it crosses once, where loopbridge crosses per step);
* for SQLAlchemy, ``nullpool``: skypilot PR #8725's workaround, an engine with
  ``NullPool`` used directly on the caller's loop (a new server connection per use).

Every repetition runs every variant once, in an order rotated by one each time; the
first repetition is a warm-up and is discarded. A ratio is the median of the
per-repetition ratios of operations per second (loopbridge / baseline), so above 1
means loopbridge is faster.

Servers: started here from the distribution's packages (like tests/servers) unless
``--postgres DSN`` and ``--redis URL`` name running ones.

    python benchmarks/bench_recipes_servers.py --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loopbridge import LoopThread, blocking, unwrap

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from recipes.recipe import load_recipe  # noqa: E402
from servers.launch import postgres, redis  # noqa: E402

perf = time.perf_counter
Op = Callable[[int], Awaitable[Any]]  # one operation from a loop
Blocking = Callable[[int], Any]  # one operation from a plain thread


# ------------------------------------------------------------------ raw units
# The same operations on the raw clients, each one coroutine: what a per-call
# wrapper sends across in one hop.
async def pg_double(pool: Any, n: int) -> int:
    async with pool.acquire() as conn, conn.transaction():
        return int(await conn.fetchval("SELECT $1::int * 2", n))


async def sa_double(engine: Any, n: int) -> int:
    from sqlalchemy import text

    async with engine.connect() as conn, conn.begin():
        result = await conn.execute(text("SELECT :n * 2"), {"n": n})
        return int(result.scalar_one())


async def redis_hit(client: Any, key: str) -> list[int]:
    await client.incr(key)
    async with client.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.incr(key)
        return list(await pipe.execute())


# ------------------------------------------------------------------ scenarios
class Scenario:
    """One operation: its loopbridge and baseline forms, for loops and threads."""

    def __init__(
        self,
        name: str,
        loop_variants: dict[str, Callable[[], Op]],
        thread_variants: dict[str, Blocking],
    ) -> None:
        self.name = name
        self.loop_variants = loop_variants
        self.thread_variants = thread_variants


def rcts(owner: LoopThread, fn: Callable[[int], Awaitable[Any]]) -> Callable[[], Op]:
    """The per-call wrapper for loops: one run_coroutine_threadsafe hop per call."""

    def make() -> Op:
        loop = owner.loop

        async def op(i: int) -> Any:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(i), loop))

        return op

    return make


def rcts_blocking(owner: LoopThread, fn: Callable[[int], Awaitable[Any]]) -> Blocking:
    loop = owner.loop
    return lambda i: asyncio.run_coroutine_threadsafe(fn(i), loop).result()


def scenarios(owner: LoopThread, pg_dsn: str, sa_url: str, redis_url: str, size: int) -> Any:
    asyncpg_recipe = load_recipe("asyncpg")
    sa_recipe = load_recipe("sqlalchemy")
    redis_recipe = load_recipe("redis")
    pool = asyncpg_recipe.open_pool(owner, pg_dsn, min_size=size, max_size=size)
    engine = sa_recipe.open_engine(owner, sa_url, pool_size=size, max_overflow=0)
    client = redis_recipe.open_client(owner, redis_url)
    queries = asyncpg_recipe.open_queries(owner, pool)
    raw_pool, raw_engine, raw_client = unwrap(pool), unwrap(engine), unwrap(client)

    def nullpool() -> Op:  # a NullPool engine made on (and used from) the caller's loop
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        local = create_async_engine(sa_url, poolclass=NullPool)
        return lambda i: sa_double(local, i)

    out = [
        Scenario(
            "asyncpg: pool.fetchval",
            {
                "loopbridge": lambda: lambda i: pool.fetchval("SELECT $1::int", i),
                "rcts": rcts(owner, lambda i: raw_pool.fetchval("SELECT $1::int", i)),
            },
            {
                "loopbridge": lambda i: blocking(pool).fetchval("SELECT $1::int", i),
                "rcts": rcts_blocking(owner, lambda i: raw_pool.fetchval("SELECT $1::int", i)),
            },
        ),
        Scenario(
            "asyncpg: acquire + transaction + fetchval",
            {
                "loopbridge": lambda: lambda i: asyncpg_recipe.double_async(pool, i),
                "rcts": rcts(owner, lambda i: pg_double(raw_pool, i)),
            },
            {
                "loopbridge": lambda i: asyncpg_recipe.double(pool, i),
                "rcts": rcts_blocking(owner, lambda i: pg_double(raw_pool, i)),
            },
        ),
        Scenario(
            "asyncpg: the same unit as one method (Queries.double)",
            {
                "loopbridge": lambda: queries.double,
                "rcts": rcts(owner, lambda i: pg_double(raw_pool, i)),
            },
            {
                "loopbridge": blocking(queries).double,
                "rcts": rcts_blocking(owner, lambda i: pg_double(raw_pool, i)),
            },
        ),
        Scenario(
            "SQLAlchemy: connect + begin + execute",
            {
                "loopbridge": lambda: lambda i: sa_recipe.double_async(engine, i),
                "rcts": rcts(owner, lambda i: sa_double(raw_engine, i)),
                "nullpool": nullpool,
            },
            {
                "loopbridge": lambda i: sa_recipe.double(engine, i),
                "rcts": rcts_blocking(owner, lambda i: sa_double(raw_engine, i)),
            },
        ),
        Scenario(
            "redis: INCR",
            {
                "loopbridge": lambda: lambda i: client.incr("bench"),
                "rcts": rcts(owner, lambda i: raw_client.incr("bench")),
            },
            {
                "loopbridge": lambda i: blocking(client).incr("bench"),
                "rcts": rcts_blocking(owner, lambda i: raw_client.incr("bench")),
            },
        ),
        Scenario(
            "redis: INCR + MULTI pipeline",
            {
                "loopbridge": lambda: lambda i: redis_recipe.count_hit_async(client, "bench"),
                "rcts": rcts(owner, lambda i: redis_hit(raw_client, "bench")),
            },
            {
                "loopbridge": lambda i: redis_recipe.count_hit(client, "bench"),
                "rcts": rcts_blocking(owner, lambda i: redis_hit(raw_client, "bench")),
            },
        ),
    ]

    def close() -> None:
        asyncpg_recipe.close_pool(pool)
        sa_recipe.close_engine(engine)
        redis_recipe.close_client(client)

    return out, close


# ------------------------------------------------------------------ measuring
def run_loop(make: Callable[[], Op], ops: int, concurrency: int) -> float:
    """Operations per second from one asyncio loop, ``concurrency`` tasks."""

    async def main() -> float:
        op = make()
        per = max(1, ops // concurrency)

        async def worker() -> None:
            for i in range(per):
                await op(i)

        t0 = perf()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return per * concurrency / (perf() - t0)

    return asyncio.run(main())


def run_threads(fn: Blocking, ops: int, concurrency: int, workers: ThreadPoolExecutor) -> float:
    """Operations per second from ``concurrency`` plain threads."""
    per = max(1, ops // concurrency)
    # The start is read before any worker is released (the barrier's action), not by
    # this thread after it: workers could be well on by then.
    starts: list[float] = []
    start = threading.Barrier(concurrency + 1, action=lambda: starts.append(perf()))

    def worker() -> None:
        start.wait()
        for i in range(per):
            fn(i)

    futures = [workers.submit(worker) for _ in range(concurrency)]
    start.wait()
    for f in futures:
        f.result()
    return per * concurrency / (perf() - starts[0])


def measure(args: argparse.Namespace, cases: list[Scenario]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cells = [
        (s, caller, variant)
        for s in cases
        for caller, variants in (("loop", s.loop_variants), ("threads", s.thread_variants))
        for variant in variants
    ]
    samples: dict[tuple[str, str, str], list[float]] = {(s.name, c, v): [] for s, c, v in cells}
    with ThreadPoolExecutor(args.concurrency) as workers:
        for rep in range(args.reps + 1):
            order = cells[rep % len(cells) :] + cells[: rep % len(cells)]
            for s, caller, variant in order:
                if caller == "loop":
                    rate = run_loop(s.loop_variants[variant], args.ops, args.concurrency)
                else:
                    fn = s.thread_variants[variant]
                    rate = run_threads(fn, args.ops, args.concurrency, workers)
                if rep:  # the first repetition is a warm-up
                    samples[(s.name, caller, variant)].append(rate)
    for s in cases:
        for caller, variants in (("loop", s.loop_variants), ("threads", s.thread_variants)):
            ours = samples[(s.name, caller, "loopbridge")]
            for variant in variants:
                if variant == "loopbridge":
                    continue
                base = samples[(s.name, caller, variant)]
                ratios = [a / b for a, b in zip(ours, base)]
                rows.append(
                    {
                        "operation": s.name,
                        "caller": f"{caller} c={args.concurrency}",
                        "baseline": variant,
                        "loopbridge_ops_s": statistics.median(ours),
                        "baseline_ops_s": statistics.median(base),
                        "ratio": statistics.median(ratios),
                    }
                )
    return rows


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    with contextlib.ExitStack() as stack:
        if args.postgres:
            dsn = args.postgres
        else:
            pg = stack.enter_context(postgres())
            dsn = pg.dsn
        url = args.redis or stack.enter_context(redis()).url
        yield dsn, dsn.replace("postgresql://", "postgresql+asyncpg://", 1), url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="measured repetitions (plus a warm-up)")
    ap.add_argument("--ops", type=int, default=1600, help="operations per cell")
    ap.add_argument("--concurrency", type=int, default=16, help="caller tasks or threads")
    ap.add_argument("--pool-size", type=int, default=8, help="pool size of each client")
    ap.add_argument("--postgres", help="DSN of a running server (default: start one)")
    ap.add_argument("--redis", help="URL of a running server (default: start one)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)

    with (
        servers(args) as (dsn, sa_url, redis_url),
        LoopThread("bench-owner", use_uvloop=False) as owner,
    ):
        cases, close = scenarios(owner, dsn, sa_url, redis_url, args.pool_size)
        try:
            rows = measure(args, cases)
        finally:
            close()
    print("| operation | caller | baseline | loopbridge ops/s | baseline ops/s | ratio |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['operation']} | {r['caller']} | {r['baseline']} | "
            f"{r['loopbridge_ops_s']:.0f} | {r['baseline_ops_s']:.0f} | {r['ratio']:.2f} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
