"""The HTTP load generator: closed-loop workers over real loopback HTTP (httpx).

It runs in a child process (see :class:`LoadProcess`) so that the client's own
Python work does not share the server process's GIL: the server process then
looks like a real deployment (engine owner loop, HTTP thread, EngineCore
process), and the measured latency is what a separate client sees.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import re
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["Job", "LoadProcess", "Sample", "run_job"]


@dataclass(frozen=True)
class Job:
    """One batch of requests against one server."""

    url: str
    model: str
    requests: int
    concurrency: int
    prompt_len: int
    output_len: int
    stream: bool
    timeout_s: float
    seed: int = 0


@dataclass
class Sample:
    """One request: times are seconds from the start of the job."""

    start: float
    ttft: float  # first token (streaming), else the whole response
    e2e: float
    tokens: int
    error: str | None = None


def _prompt(job: Job, i: int) -> list[int]:
    # Token ids, so the prompt length is exact for any tokenizer; distinct per
    # request, so no prefix cache hit makes one request cheaper than another.
    base = 10 + (job.seed * 131 + i * 17) % 200
    return [10 + (base + k * 7) % 250 for k in range(job.prompt_len)]


_FIRST_TEXT = re.compile(rb'"text":"[^"]')
_TAIL = 8192


def _stream_end(tail: bytes, error: bool) -> tuple[int, str | None]:
    """Completion tokens from the usage event at the end of an SSE stream."""
    tokens = 0
    for line in reversed(tail.split(b"\n")):
        if not line.startswith(b"data: {"):
            continue
        try:
            event = json.loads(line[6:])
        except ValueError:
            continue  # cut off at the start of the tail
        if "error" in event:
            return tokens, f"stream error: {str(event)[:200]}"
        usage = event.get("usage")
        if usage and not tokens:
            tokens = int(usage["completion_tokens"])
            if not error:
                return tokens, None
    if error:
        return tokens, "stream error (not in the last events)"
    return tokens, None


async def _one(client: Any, job: Job, i: int, t_job: float) -> Sample:
    body: dict[str, Any] = {
        "model": job.model,
        "prompt": _prompt(job, i),
        "max_tokens": job.output_len,
        "min_tokens": job.output_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": job.stream,
    }
    if job.stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    start = t0 - t_job
    try:
        if not job.stream:
            resp = await client.post("/v1/completions", json=body)
            t1 = time.perf_counter()
            if resp.status_code != 200:
                return Sample(
                    start, t1 - t0, t1 - t0, 0, f"HTTP {resp.status_code}: {resp.text[:200]}"
                )
            tokens = int(resp.json()["usage"]["completion_tokens"])
            err = (
                None if tokens == job.output_len else f"{tokens} tokens, expected {job.output_len}"
            )
            return Sample(start, t1 - t0, t1 - t0, tokens, err)
        # Scanning raw bytes instead of decoding every event keeps the client
        # cheap: at high concurrency a per-event json.loads made the load
        # generator, not the server, the bottleneck.
        ttft: float | None = None
        tail = b""
        error = False
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                t1 = time.perf_counter()
                return Sample(start, t1 - t0, t1 - t0, 0, f"HTTP {resp.status_code}: {text[:200]}")
            async for chunk in resp.aiter_raw():
                if ttft is None and _FIRST_TEXT.search(chunk):
                    ttft = time.perf_counter() - t0
                if b'"error"' in chunk:
                    error = True
                tail = (tail + chunk)[-_TAIL:]
        t1 = time.perf_counter()
        tokens, err = _stream_end(tail, error)
        if err is None and tokens != job.output_len:
            err = f"{tokens} tokens, expected {job.output_len}"
        return Sample(start, ttft if ttft is not None else t1 - t0, t1 - t0, tokens, err)
    except Exception as exc:  # every failure is a sample, never an abort of the run
        t1 = time.perf_counter()
        return Sample(start, t1 - t0, t1 - t0, 0, f"{type(exc).__name__}: {exc}"[:300])


async def _open_connections(client: Any, n: int) -> None:
    """Open ``n`` kept-alive connections before the clock starts.

    Each of ``n`` requests holds its connection until all ``n`` have their
    response headers, so the pool ends up with ``n`` distinct connections,
    which the workers then reuse: no measured request pays for a connect.
    """
    opened = 0
    all_open = asyncio.Event()

    async def hold() -> None:
        nonlocal opened
        # /v1/models needs no engine call, so every mode answers it alike.
        async with client.stream("GET", "/v1/models") as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"GET /v1/models answered {resp.status_code}")
            opened += 1
            if opened == n:
                all_open.set()
            await all_open.wait()
            await resp.aread()  # read to the end: the connection goes back to the pool

    await asyncio.gather(*(hold() for _ in range(n)))


async def run_job(job: Job) -> tuple[float, list[Sample]]:
    """Run ``job`` with ``concurrency`` workers on kept-alive connections; return (wall s, samples)."""
    import httpx

    limits = httpx.Limits(
        max_connections=job.concurrency, max_keepalive_connections=job.concurrency
    )
    samples: list[Sample] = []
    next_i = 0
    workers = min(job.concurrency, job.requests)
    async with httpx.AsyncClient(base_url=job.url, timeout=job.timeout_s, limits=limits) as client:
        await _open_connections(client, workers)
        t_job = time.perf_counter()

        async def worker() -> None:
            nonlocal next_i
            while next_i < job.requests:
                i = next_i
                next_i += 1
                samples.append(await _one(client, job, i, t_job))

        await asyncio.gather(*(worker() for _ in range(workers)))
        wall = time.perf_counter() - t_job
    return wall, samples


def _child(conn: Connection) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        job = Job(**msg)
        try:
            wall, samples = asyncio.run(run_job(job))
            conn.send(("ok", wall, [asdict(s) for s in samples]))
        except BaseException as exc:  # report, keep serving
            conn.send(("error", 0.0, f"{type(exc).__name__}: {exc}"))


class LoadProcess:
    """A child process that runs jobs on request."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child, args=(child,), name="loopbridge-bench-load", daemon=True
        )
        self._proc.start()
        child.close()

    def run(self, job: Job) -> tuple[float, list[Sample]]:
        self._conn.send(asdict(job))
        # The job bounds itself (per-request timeout); this bounds a wedged child.
        limit = job.timeout_s * (job.requests / max(1, job.concurrency) + 2) + 60
        if not self._conn.poll(limit):
            raise TimeoutError(f"load generator gave no answer within {limit:.0f} s")
        status, wall, payload = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"load generator failed: {payload}")
        return wall, [Sample(**s) for s in payload]

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        self._conn.close()

    def __enter__(self) -> LoadProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
