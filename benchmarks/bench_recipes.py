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
uvicorn app and an in-process ``grpc.aio`` server on loopback, as in the tests,
on the same machine: the ratio is end to end, server included.

    python benchmarks/bench_recipes.py
    python benchmarks/bench_recipes.py --client grpc --callers loop --calls 5000 --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import statistics
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

        self.loop = lb.LoopThread(name="grpc-server").start()
        self.server, port = self.loop.run(start)
        return f"127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.loop.run(self.server.stop, None)
        self.loop.stop()


# -------------------------------------------------------------------- clients
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
    raw = lb.unwrap(stub)
    c = Client()

    async def raw_call() -> bytes:
        return await raw.Say(b"x")  # type: ignore[no-any-return]

    c.raw_call = raw_call
    c.bridged = lambda: recipe.say(stub, b"x")
    c.bridged_blocking = lambda: recipe.say_blocking(stub, b"x")
    c.close = lambda: recipe.close_channel(channel)
    return c


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


def measure(
    c: Client, owner: lb.LoopThread, callers: str, args: argparse.Namespace
) -> dict[str, Any]:
    loop = owner.loop
    if callers == "threads":

        def baseline() -> float:
            run = asyncio.run_coroutine_threadsafe
            return threads_batch(lambda: run(c.raw_call(), loop).result(), args.calls, args.workers)

        def bridged() -> float:
            return threads_batch(c.bridged_blocking, args.calls, args.workers)

    else:

        def baseline() -> float:
            async def one() -> Any:
                return await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(c.raw_call(), loop)
                )

            return loop_batch(one, args.calls, args.concurrency)

        def bridged() -> float:
            return loop_batch(c.bridged, args.calls, args.concurrency)

    baseline(), bridged()  # warm up: connections, proxy classes
    rows: dict[str, list[float]] = {"run_coroutine_threadsafe": [], "loopbridge": []}
    for rep in range(args.reps):
        pair = [("run_coroutine_threadsafe", baseline), ("loopbridge", bridged)]
        for name, fn in pair if rep % 2 == 0 else pair[::-1]:
            rows[name].append(fn())
    base = statistics.median(rows["run_coroutine_threadsafe"])
    ours = statistics.median(rows["loopbridge"])
    return {
        "calls_per_s": {"run_coroutine_threadsafe": round(base), "loopbridge": round(ours)},
        "ratio": round(ours / base, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--client", choices=["httpx", "aiohttp", "grpc", "all"], default="all")
    ap.add_argument("--callers", choices=["threads", "loop", "both"], default="both")
    ap.add_argument("--calls", type=int, default=2000, help="calls per batch")
    ap.add_argument("--reps", type=int, default=3, help="batches per way (median reported)")
    ap.add_argument("--workers", type=int, default=16, help="threads, for --callers threads")
    ap.add_argument("--concurrency", type=int, default=64, help="tasks, for --callers loop")
    args = ap.parse_args()
    clients = ["httpx", "aiohttp", "grpc"] if args.client == "all" else [args.client]
    callers = ["threads", "loop"] if args.callers == "both" else [args.callers]
    results: dict[str, Any] = {}
    with Uvicorn() as url, GrpcServer() as target, lb.LoopThread(name="client-owner") as owner:
        for kind in clients:
            pool = max(args.workers, args.concurrency)
            c = (
                grpc_client(owner, target)
                if kind == "grpc"
                else http_client(kind, owner, url, pool)
            )
            try:
                for who in callers:
                    results[f"{kind}, {who}"] = r = measure(c, owner, who, args)
                    print(f"{kind:8} {who:8} {json.dumps(r)}", flush=True)
            finally:
                c.close()
    print(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
