"""Throughput of the recipes in docs/recipes.md against a per-call
``run_coroutine_threadsafe`` wrapper, measured in the same run.

Each client is owned by one loop on a ``LoopThread``.  Two ways to call it from
elsewhere, against the same server, in alternating batches (the order swaps
each repetition, so drift in machine load hits both alike):

* baseline: every call is a coroutine submitted with
  ``asyncio.run_coroutine_threadsafe(coro, owner_loop)``, waited on with
  ``.result()`` from a thread, or ``await asyncio.wrap_future(...)`` from a loop;
* loopbridge: the recipe's proxy (``await``) or blocking face (threads).

Callers: ``threads`` (a pool of plain threads, as a WSGI server has) and
``loop`` (many concurrent tasks on one other asyncio loop).  The servers are a
uvicorn app and a ``grpc.aio`` server on loopback, in a child process of their
own, as a real upstream is: in the client's process their work would share its
GIL, and the GIL's hand-offs between server, owner loop and callers made the
rate swing by 2x from one batch to the next.

A row's ``ratio`` is the median, over the repetitions, of loopbridge's rate
divided by the baseline's in the same repetition (two batches back to back:
what drift in the machine's speed touches least); ``ratio_range`` is their
least and greatest.  Each row also gives the client process's CPU time per
call (``cpu_us_per_call``): on a busy machine throughput swings with what else
runs, CPU per call much less, so read the two together.  ``crossings`` is how
many times one request crosses to the owner loop each way (the baseline:
once).  The run records the load average at its start and end (``load``).
``--pin`` keeps the client on one CPU and the servers on the others.
``--client stand-in`` runs the grpc recipe's code on a stub whose call does no
work (a future the owner resolves on its next iteration): the crossing's own
cost each way, which a real call's work dilutes.

    python benchmarks/bench_recipes.py
    python benchmarks/bench_recipes.py --client grpc --callers loop --calls 5000 --reps 5

``--profile N``: no throughput; N calls each way under cProfile, one profile
per thread (CPU time, so waits cost nothing), printed as the owner loop's
thread and the callers' threads, per call.  Needs Python 3.11 or older (from
3.12 on cProfile is one profiler for the whole process)::

    python3.11 benchmarks/bench_recipes.py --client grpc --callers threads --profile 2000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib.util
import io
import json
import os
import pstats
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import loopbridge as lb

ROOT = Path(__file__).resolve().parents[1]


def _recipes() -> Any:
    """The loader the recipes' tests use: the recipe code is docs/recipes.md's."""
    spec = importlib.util.spec_from_file_location("recipe_loader", ROOT / "tests/recipes/recipe.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -------------------------------------------------------------------- servers
async def _json_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = json.dumps({"path": scope["path"]}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Uvicorn:
    def __enter__(self) -> str:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        config = uvicorn.Config(
            _json_app, lifespan="off", log_level="warning", backlog=1024, timeout_keep_alive=60
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})
        self.thread.start()
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/json"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.sock.close()


class GrpcServer:
    def __enter__(self) -> str:
        import grpc

        async def say(request: bytes, context: Any) -> bytes:
            return b"hello " + request

        async def start() -> tuple[Any, int]:
            same = {"request_deserializer": bytes, "response_serializer": bytes}
            handler = grpc.method_handlers_generic_handler(
                "demo.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say, **same)}
            )
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((handler,))
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            return server, port

        self.loop = lb.LoopThread(name="grpc-server", use_uvloop=False).start()
        self.server, port = self.loop.run(start)
        return f"127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.loop.run(self.server.stop, None)
        self.loop.stop()


def serve(kind: str, cpus: str | None) -> None:
    """``--serve KIND`` (the benchmark's own child process): run that server, print
    its address, and serve until standard input closes.  ``cpus``: the CPUs it
    keeps to (``--pin``: those the client left, out of the ones it was allowed)."""
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    with Uvicorn() if kind == "http" else GrpcServer() as address:
        print(address, flush=True)
        sys.stdin.read()


class ServerProcess:
    """A server in a child process: its work does not share the client's GIL, as a
    real upstream's does not (in one process, the GIL's hand-offs between server,
    owner loop and callers made the rate swing by 2x between batches).  ``cpus``:
    where it runs (None: wherever the client may)."""

    def __init__(self, kind: str, cpus: set[int] | None) -> None:
        self.kind = kind
        self.cpus = cpus

    def __enter__(self) -> str:
        pinned = ["--serve-cpus", ",".join(map(str, sorted(self.cpus)))] if self.cpus else []
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", self.kind, *pinned],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        address = self.proc.stdout.readline().strip()
        if not address:
            raise SystemExit(f"the {self.kind} server did not start (exit {self.proc.wait()})")
        return address

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# -------------------------------------------------------------------- clients
#: Crossings to the owner loop per request through each recipe (the baseline's
#: coroutine does the whole request in one): aiohttp's ``async with
#: session.get(...)``, ``await response.json()`` and the exit are three.
CROSSINGS = {"httpx": 1, "aiohttp": 3, "grpc": 1, "stand-in": 1}


class Client:
    """One client as the baseline uses it (``raw_call``: a coroutine run on the
    owner) and as the recipe exposes it (``bridged``, ``bridged_blocking``)."""

    raw_call: Callable[[], Awaitable[Any]]
    bridged: Callable[[], Awaitable[Any]]
    bridged_blocking: Callable[[], Any]
    close: Callable[[], None]


def http_client(kind: str, owner: lb.LoopThread, url: str, pool: int) -> Client:
    recipe = _recipes().load_recipe(kind)
    c = Client()
    if kind == "httpx":
        import httpx

        # Every caller keeps its connection: no churn through a smaller keep-alive pool.
        limits = httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
        proxied = recipe.open_client(owner, limits=limits)
        c.bridged = lambda: recipe.get_json(proxied, url)
        c.bridged_blocking = lambda: recipe.get_json_blocking(proxied, url)
        c.close = lambda: recipe.close_client(proxied)
    else:
        proxied = recipe.open_session(owner)
        c.bridged = lambda: recipe.get_json(proxied, url)
        c.bridged_blocking = lambda: recipe.get_json_blocking(proxied, url)
        c.close = lambda: recipe.close_session(proxied)
    # The same client object, used on its owner only, per call: the baseline.
    raw = lb.unwrap(proxied)

    async def raw_call() -> Any:
        if kind == "httpx":
            return (await raw.get(url)).json()
        async with raw.get(url) as response:
            return await response.json()

    c.raw_call = raw_call
    return c


def grpc_client(owner: lb.LoopThread, target: str) -> Client:
    recipe = _recipes().load_recipe("grpc")
    channel, stub = recipe.open_stub(owner, target)
    return _grpc_recipe_client(recipe, stub, lambda: recipe.close_channel(channel))


def _grpc_recipe_client(recipe: Any, stub: Any, close: Callable[[], None]) -> Client:
    """The grpc recipe's ``say`` on ``stub`` (a proxy), and the same request on the
    object itself as the baseline: ``Say(b"x", timeout=10)``."""
    raw = lb.unwrap(stub)
    c = Client()

    async def raw_call() -> bytes:
        return await raw.Say(b"x", timeout=10)  # type: ignore[no-any-return]

    c.raw_call = raw_call
    c.bridged = lambda: recipe.say(stub, b"x")
    c.bridged_blocking = lambda: recipe.say_blocking(stub, b"x")
    c.close = close
    return c


class _Multicallable:
    """A grpc.aio multicallable's shape without grpc: the call is a future that the
    owner loop resolves on its next iteration, as an RPC's answer arrives."""

    def __call__(self, request: bytes, timeout: float | None = None) -> asyncio.Future[bytes]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bytes] = loop.create_future()
        loop.call_soon(answer.set_result, request)
        return answer


class _StandInStub:
    def __init__(self) -> None:
        self.Say = _Multicallable()


def stand_in_client(owner: lb.LoopThread) -> Client:
    """``--client stand-in``: the grpc recipe's own code (its rule, ``say`` and
    ``say_blocking``) on a stub whose call does no work: what the crossing costs,
    each way, without grpc's own work per call."""
    recipe = _recipes().load_recipe("grpc")

    async def make() -> _StandInStub:
        return lb.adopt(_StandInStub(), returns={"Say": recipe.METHOD})

    return _grpc_recipe_client(recipe, lb.proxy(owner.run(make)), lambda: None)


# -------------------------------------------------------------------- callers
def threads_batch(fn: Callable[[], Any], calls: int, workers: int) -> float:
    """Calls per second from a pool of plain threads."""
    per = calls // workers

    def work(_: int) -> None:
        for _ in range(per):
            fn()

    with ThreadPoolExecutor(workers) as pool:
        t0 = time.perf_counter()
        list(pool.map(work, range(workers)))
        return per * workers / (time.perf_counter() - t0)


def loop_batch(fn: Callable[[], Awaitable[Any]], calls: int, concurrency: int) -> float:
    """Calls per second from ``concurrency`` tasks on one other asyncio loop."""
    per = calls // concurrency

    async def main() -> float:
        async def work() -> None:
            for _ in range(per):
                await fn()

        t0 = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(concurrency)))
        return per * concurrency / (time.perf_counter() - t0)

    return asyncio.run(main())


def ways(c: Client, owner: lb.LoopThread, callers: str) -> dict[str, Callable[[], Any]]:
    """One request each way, as the callers make it: a plain call (``threads``)
    or a coroutine function (``loop``)."""
    loop = owner.loop
    if callers == "threads":
        run = asyncio.run_coroutine_threadsafe
        return {
            "run_coroutine_threadsafe": lambda: run(c.raw_call(), loop).result(),
            "loopbridge": c.bridged_blocking,
        }

    async def one() -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(c.raw_call(), loop))

    return {"run_coroutine_threadsafe": one, "loopbridge": c.bridged}


def measure(
    c: Client, owner: lb.LoopThread, callers: str, args: argparse.Namespace
) -> dict[str, Any]:
    def batch(fn: Callable[[], Any]) -> tuple[float, float]:
        """Calls per second, and process CPU seconds per call."""
        gc.collect()  # no batch pays for garbage the one before it left
        cpu = time.process_time()
        if callers == "threads":
            rate = threads_batch(fn, args.calls, args.workers)
        else:
            rate = loop_batch(fn, args.calls, args.concurrency)
        return rate, (time.process_time() - cpu) / args.calls

    pair = list(ways(c, owner, callers).items())
    for _, fn in pair:
        batch(fn)  # warm up: connections, proxy classes
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in pair}
    for rep in range(args.reps):
        for name, fn in pair if rep % 2 == 0 else pair[::-1]:
            rows[name].append(batch(fn))
    rate = {k: statistics.median(r for r, _ in v) for k, v in rows.items()}
    cpu = {k: statistics.median(s for _, s in v) for k, v in rows.items()}
    # Each repetition's two batches ran back to back: their ratio is what drift in
    # the machine's speed touches least. The row's ratio is the median of those.
    paired = [
        lb[0] / base[0] for lb, base in zip(rows["loopbridge"], rows["run_coroutine_threadsafe"])
    ]
    return {
        "calls_per_s": {k: round(v) for k, v in rate.items()},
        "ratio": round(statistics.median(paired), 2),
        "ratio_range": [round(min(paired), 2), round(max(paired), 2)],
        "cpu_us_per_call": {k: round(v * 1e6) for k, v in cpu.items()},
    }


def profile(c: Client, owner: lb.LoopThread, callers: str, args: argparse.Namespace) -> None:
    """``--profile``: each way's calls under one cProfile per thread (CPU time)."""
    if sys.version_info >= (3, 12):
        raise SystemExit("--profile needs Python 3.11 or older (one profiler per thread)")
    width = args.workers if callers == "threads" else args.concurrency
    calls = args.profile // width * width
    for name, fn in ways(c, owner, callers).items():
        on_owner = cProfile.Profile(time.thread_time_ns, 1e-9)
        owner.loop.call_soon_threadsafe(on_owner.enable)
        made = _profiled_batch(fn, callers, args.profile, width)
        owner.run(_disable, on_owner)
        for side, profs in (("owner loop", [on_owner]), ("callers", made)):
            out = io.StringIO()
            stats = pstats.Stats(profs[0], stream=out)
            for p in profs[1:]:
                stats.add(p)
            total = stats.total_tt  # type: ignore[attr-defined]
            print(f"== {name}, {side}: {total / calls * 1e6:.1f} us of CPU per call")
            stats.sort_stats("tottime").print_stats(args.top)
            print("\n".join(line for line in out.getvalue().splitlines()[4:] if line.strip()))


def _profiled_batch(
    fn: Callable[[], Any], callers: str, calls: int, width: int
) -> list[cProfile.Profile]:
    """Warm up, then ``calls`` calls of ``fn`` with a profile on each caller thread
    (threads: around each call; a loop: its whole run); the profiles."""
    made: list[cProfile.Profile] = []
    here = threading.local()

    def mine() -> cProfile.Profile:
        p: cProfile.Profile | None = getattr(here, "prof", None)
        if p is None:
            here.prof = p = cProfile.Profile(time.thread_time_ns, 1e-9)
            made.append(p)
        return p

    if callers == "threads":

        def call() -> Any:
            p = mine()
            p.enable()
            try:
                return fn()
            finally:
                p.disable()

        threads_batch(fn, width * 4, width)
        threads_batch(call, calls, width)
        return made

    async def call_async() -> Any:
        mine().enable()  # stays on: the caller loop's own work counts too
        return await fn()

    loop_batch(fn, width * 4, width)
    loop_batch(call_async, calls, width)
    for p in made:
        p.disable()
    return made


async def _disable(p: cProfile.Profile) -> None:
    p.disable()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--client",
        choices=["httpx", "aiohttp", "grpc", "stand-in", "all"],
        default="all",
        help="all: the three recipes (stand-in: the grpc recipe on a stub that does no work)",
    )
    ap.add_argument("--callers", choices=["threads", "loop", "both"], default="both")
    ap.add_argument("--calls", type=int, default=640, help="calls per batch")
    ap.add_argument(
        "--reps", type=int, default=9, help="batches per way (the median paired ratio reported)"
    )
    ap.add_argument("--workers", type=int, default=16, help="threads, for --callers threads")
    ap.add_argument("--concurrency", type=int, default=64, help="tasks, for --callers loop")
    ap.add_argument("--profile", type=int, default=0, help="profile this many calls each way")
    ap.add_argument("--top", type=int, default=25, help="functions per profile")
    ap.add_argument(
        "--pin",
        action="store_true",
        help="keep the process on one CPU (on small VMs, cross-CPU wake-ups switch between "
        "a fast and a much slower mode for seconds at a time; the GIL makes pinning cheap)",
    )
    ap.add_argument("--serve", choices=["http", "grpc"], help=argparse.SUPPRESS)
    ap.add_argument("--serve-cpus", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.serve_cpus)
    servers: set[int] | None = None
    if args.pin:  # before any thread starts: the client on one allowed CPU, the servers on the rest
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(allowed)})
        servers = allowed - {min(allowed)} or None
    clients = ["httpx", "aiohttp", "grpc"] if args.client == "all" else [args.client]
    callers = ["threads", "loop"] if args.callers == "both" else [args.callers]
    results: dict[str, Any] = {}
    load = {"start": os.getloadavg()}
    print(f"load average at start: {load['start']}", flush=True)
    with (
        ServerProcess("http", servers) as url,
        ServerProcess("grpc", servers) as target,
        lb.LoopThread(name="client-owner", use_uvloop=False) as owner,
    ):
        for kind in clients:
            pool = max(args.workers, args.concurrency)
            if kind == "grpc":
                c = grpc_client(owner, target)
            elif kind == "stand-in":
                c = stand_in_client(owner)
            else:
                c = http_client(kind, owner, url, pool)
            try:
                for who in callers:
                    if args.profile:
                        profile(c, owner, who, args)
                        continue
                    r = measure(c, owner, who, args)
                    results[f"{kind}, {who}"] = r = {**r, "crossings": CROSSINGS[kind]}
                    print(f"{kind:8} {who:8} {json.dumps(r)}", flush=True)
            finally:
                c.close()
    load["end"] = os.getloadavg()
    print(f"load average at end: {load['end']}", flush=True)
    if not args.profile:
        print(json.dumps({"args": vars(args), "load": load, "results": results}, indent=1))


if __name__ == "__main__":
    main()
