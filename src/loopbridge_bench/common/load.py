"""The HTTP load generator: closed-loop workers or open-loop Poisson arrivals over real
loopback HTTP (aiohttp), against an OpenAI-compatible server (``/v1/completions``,
``/v1/chat/completions``) or SGLang's native ``/generate``.

It runs in a child process (see :class:`LoadProcess`) so that the client's own
Python work does not share the server process's GIL: the server process then
looks like a real deployment (engine owner loop, HTTP thread, EngineCore
process), and the measured latency is what a separate client sees.

Prompts: request ``i`` of a job is request ``first_id + i`` of the run, and its
prompt starts (after an optional shared prefix) with that number written in
:data:`ID_TOKENS` token ids, so no two requests of a run share a prompt, nor
the first block of one, whatever the round, mode or scenario: no prefix-cache
hit makes one request cheaper than another unless ``shared_prefix`` asks for
it.  Lengths depend on ``seed`` and ``i`` only, so every mode of one round and
scenario gets the same sequence of lengths.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import multiprocessing as mp
import random
import re
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

__all__ = [
    "ENDPOINTS",
    "ID_TOKENS",
    "LENGTH_SHAPES",
    "Job",
    "JobRun",
    "LoadProcess",
    "OPENAI_ENDPOINTS",
    "REQUEST_ID_HEADER",
    "Sample",
    "length_bounds",
    "prompt_tokens",
    "request_id",
    "request_lengths",
    "arrival_times",
    "run_job",
]

#: Token ids used in prompts: 10..259, valid in any tokenizer with 260+ ids.
_TOKEN_LO, _TOKEN_BASE = 10, 250
#: Leading prompt tokens that spell the request's number in the run (250**4 ids).
ID_TOKENS = 4
#: Length distributions: ``fixed`` (every request the given lengths) or ``lognormal``
#: (median = the given length, log-sigma below, clipped to [median/4, median*4]):
#: the right-skewed shape of chat traffic (many short prompts and answers, a long tail).
LENGTH_SHAPES = {"fixed": (0.0, 0.0), "lognormal": (0.8, 0.6)}  # (prompt sigma, output sigma)
_CLIP = 4.0
ENDPOINTS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "generate": "/generate",  # SGLang's native API: token ids in, token ids out
}
#: The endpoints of an OpenAI-compatible server (``vllm serve``'s).
OPENAI_ENDPOINTS = ("completions", "chat")
#: The header that carries a request's number in the run to an OpenAI-compatible server.
REQUEST_ID_HEADER = "X-Request-Id"


def request_id(number: int) -> str:
    """The ``X-Request-Id`` of the run's request ``number`` (vLLM builds its request id on it)."""
    return f"lb{number}"


#: A request that needs no engine call, per endpoint: it opens the connections.
_WARM_PATHS = {"completions": "/v1/models", "chat": "/v1/models", "generate": "/model_info"}


@dataclass(frozen=True)
class Job:
    """One batch of requests against one server."""

    url: str
    model: str
    requests: int
    concurrency: int  # closed loop: workers; open loop: most connections
    prompt_len: int  # median with a length distribution
    output_len: int
    stream: bool
    timeout_s: float
    seed: int = 0  # lengths and arrival times
    first_id: int = 0  # the run-wide number of request 0: prompts are unique per number
    lengths: str = "fixed"  # a key of LENGTH_SHAPES
    shared_prefix: int = 0  # tokens every prompt of the run starts with
    endpoint: str = "completions"  # a key of ENDPOINTS
    rate: float = 0.0  # open loop: Poisson arrivals at this many requests/s; 0: closed loop


@dataclass
class Sample:
    """One request: times are seconds from the start of the job."""

    start: float
    ttft: float  # first token (streaming), else the whole response
    e2e: float
    tokens: int
    error: str | None = None
    # Gaps between streamed events that carry text (the first one after TTFT):
    # vLLM's own `bench serve` definition of ITL.  Empty without streaming.
    itl: list[float] = field(default_factory=list)
    prompt_hash: str = ""  # of the prompt sent: the uniqueness check reads it
    output_len: int = 0  # tokens asked for
    # The request's number in the run (sent as ``X-Request-Id: lb<number>`` to an
    # OpenAI-compatible server, which makes it part of the engine's request id) and
    # when it was sent, on the host's monotonic clock (``perf_counter``: the same
    # clock in every process), so the server's own stage times line up with it.
    number: int = -1
    sent_at: float = 0.0
    # When its body went to the socket (the same clock; 0.0: not recorded). From
    # ``sent_at`` to here the request waited in the client itself.
    written_at: float = 0.0


def length_bounds(median: int, shape: str) -> tuple[int, int]:
    """The smallest and largest length the distribution ``shape`` draws around ``median``."""
    if LENGTH_SHAPES[shape] == (0.0, 0.0):
        return median, median
    return max(1, math.ceil(median / _CLIP)), int(median * _CLIP)


def request_lengths(job: Job, i: int) -> tuple[int, int]:
    """(prompt tokens, output tokens) of request ``i``: a function of seed and ``i`` only."""
    sp, so = LENGTH_SHAPES[job.lengths]
    if sp == 0.0 and so == 0.0:
        return job.prompt_len, job.output_len
    rng = random.Random(f"lengths:{job.seed}:{i}")
    out = []
    for median, sigma in ((job.prompt_len, sp), (job.output_len, so)):
        lo, hi = length_bounds(median, job.lengths)
        out.append(min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma))))))
    prompt = max(out[0], job.shared_prefix + ID_TOKENS)
    return prompt, out[1]


def prompt_tokens(job: Job, i: int) -> list[int]:
    """The prompt of request ``i``: token ids, so its length is exact for any tokenizer."""
    n, _ = request_lengths(job, i)
    rid = job.first_id + i
    digits = []
    for _ in range(ID_TOKENS):
        rid, d = divmod(rid, _TOKEN_BASE)
        digits.append(_TOKEN_LO + d)
    if rid:
        raise ValueError(f"request number {job.first_id + i} needs more than {ID_TOKENS} tokens")
    prefix = [_TOKEN_LO + (k * 7) % _TOKEN_BASE for k in range(job.shared_prefix)]
    head = prefix + digits[::-1]
    rest = n - len(head)
    if rest < 0:
        raise ValueError(f"prompt of {n} tokens cannot hold {len(head)} (prefix + number)")
    salt = job.first_id + i
    return head + [_TOKEN_LO + (salt * 31 + k * 7) % _TOKEN_BASE for k in range(rest)]


def _body(job: Job, i: int) -> tuple[dict[str, Any], str]:
    tokens = prompt_tokens(job, i)
    _, out_len = request_lengths(job, i)
    digest = hashlib.blake2b(repr(tokens).encode(), digest_size=8).hexdigest()
    if job.endpoint == "generate":
        return _generate_body(job, tokens, out_len), digest
    body: dict[str, Any] = {
        "model": job.model,
        "max_tokens": out_len,
        "min_tokens": out_len,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": job.stream,
    }
    if job.endpoint == "chat":
        # Chat takes text: one word per token id.  The chat template adds its own
        # tokens, so the prompt length is approximate (usage reports the real one).
        body["messages"] = [{"role": "user", "content": " ".join(map(str, tokens))}]
    else:
        body["prompt"] = tokens
    if job.stream:
        body["stream_options"] = {"include_usage": True}
    return body, digest


def _generate_body(job: Job, tokens: list[int], out_len: int) -> dict[str, Any]:
    """SGLang's ``GenerateReqInput``: the same lengths and sampling as the OpenAI body
    (``ignore_eos`` alone holds the length: SGLang refuses ``min_new_tokens`` without a
    tokenizer)."""
    return {
        "input_ids": tokens,
        "sampling_params": {
            "max_new_tokens": out_len,
            "ignore_eos": True,
            "temperature": 0.0,
        },
        "stream": job.stream,
    }


def _response_tokens(endpoint: str, body: Any) -> int:
    """Completion tokens of a whole (non-streamed) response."""
    if endpoint == "generate":
        return int(body["meta_info"]["completion_tokens"])
    return int(body["usage"]["completion_tokens"])


# An event that carries text: completions' "text", chat's "content" (the chat
# stream's first event, the role alone, carries "content":"").
_FIRST_TEXT = re.compile(rb'"(?:text|content)":"[^"]')
# SGLang's /generate: every event carries the request's new output (token ids here:
# the text is empty without a tokenizer); the stream ends with "data: [DONE]".
_GENERATE_EVENT = re.compile(rb"data: \{")
_EVENTS = {"completions": _FIRST_TEXT, "chat": _FIRST_TEXT, "generate": _GENERATE_EVENT}
_TAIL = 8192


def _stream_end(tail: bytes, error: bool, endpoint: str = "completions") -> tuple[int, str | None]:
    """Completion tokens from the usage event at the end of an SSE stream (SGLang's
    ``/generate``: the last event's ``meta_info``)."""
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
        usage = event.get("meta_info" if endpoint == "generate" else "usage")
        if usage and not tokens:
            tokens = int(usage["completion_tokens"])
            if not error:
                return tokens, None
    if error:
        return tokens, "stream error (not in the last events)"
    return tokens, None


async def _one(session: Any, job: Job, i: int, t_job: float) -> Sample:
    body, digest = _body(job, i)
    _, want = request_lengths(job, i)
    path = ENDPOINTS[job.endpoint]
    number = job.first_id + i
    headers = {REQUEST_ID_HEADER: request_id(number)} if job.endpoint in OPENAI_ENDPOINTS else {}
    written: list[float] = []  # filled by _written as the request's body goes out
    t0 = time.perf_counter()
    start = t0 - t_job

    def sample(ttft: float, e2e: float, tokens: int, error: str | None, itl: list[float]) -> Sample:
        wrote = written[0] if written else 0.0
        return Sample(start, ttft, e2e, tokens, error, itl, digest, want, number, t0, wrote)

    def failed(error: str) -> Sample:
        t1 = time.perf_counter()
        return sample(t1 - t0, t1 - t0, 0, error, [])

    try:
        async with session.post(
            path, json=body, headers=headers, trace_request_ctx=written
        ) as resp:
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")
                return failed(f"HTTP {resp.status}: {text[:200]}")
            if not job.stream:
                data = await resp.read()
                t1 = time.perf_counter()
                tokens = _response_tokens(job.endpoint, json.loads(data))
                err = None if tokens == want else f"{tokens} tokens, expected {want}"
                return sample(t1 - t0, t1 - t0, tokens, err, [])
            ttft, itl, tail, error = await _read_stream(resp, _EVENTS[job.endpoint], t0)
        t1 = time.perf_counter()
        tokens, err = _stream_end(tail, error, job.endpoint)
        if err is None and tokens != want:
            err = f"{tokens} tokens, expected {want}"
        ttft_s = ttft if ttft is not None else t1 - t0
        return sample(ttft_s, t1 - t0, tokens, err, itl)
    except Exception as exc:  # every failure is a sample, never an abort of the run
        return failed(f"{type(exc).__name__}: {exc}"[:300])


async def _read_stream(
    resp: Any, counted: re.Pattern[bytes], t0: float
) -> tuple[float | None, list[float], bytes, bool]:
    """Read an SSE response to its end: (TTFT, ITL gaps, the stream's tail, error seen).

    Scanning raw bytes instead of decoding every event keeps the client cheap: at
    high concurrency a per-event ``json.loads`` made the load generator, not the
    server, the bottleneck.  Events that arrive in one read get one gap and zeros,
    as they would in any client.
    """
    ttft: float | None = None
    last = 0.0
    itl: list[float] = []
    tail = b""
    error = False
    async for chunk in resp.content.iter_any():
        events = len(counted.findall(chunk))
        if events:
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            else:
                itl.append(now - last)
            itl.extend([0.0] * (events - 1))
            last = now
        if b'"error"' in chunk:
            error = True
        tail = (tail + chunk)[-_TAIL:]
    return ttft, itl, tail, error


async def _written(session: Any, ctx: Any, params: Any) -> None:
    """aiohttp's trace hook, just before a request's body goes to the socket."""
    stamps = ctx.trace_request_ctx
    if isinstance(stamps, list) and not stamps:
        stamps.append(time.perf_counter())


def _session(job: Job, connections: int) -> Any:
    """The job's aiohttp session: at most ``connections`` kept-alive connections.

    aiohttp, as vLLM's own ``vllm bench serve`` uses: its C parser reads a streamed
    event for about half the CPU time httpx takes (measured on loopback, 64
    streams), and at c = 64 the client's CPU time, not the server's, set the tail.
    Timeouts: ``timeout_s`` for a connection and for each read, none for the whole
    request (a long stream is not a stalled one).
    """
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_written)
    return aiohttp.ClientSession(
        job.url,
        connector=aiohttp.TCPConnector(
            limit=connections, limit_per_host=connections, keepalive_timeout=_KEEPALIVE_EXPIRY_S
        ),
        timeout=aiohttp.ClientTimeout(total=None, connect=job.timeout_s, sock_read=job.timeout_s),
        trace_configs=[trace],
    )


async def _open_connections(session: Any, n: int, path: str = "/v1/models") -> None:
    """Open ``n`` kept-alive connections before the clock starts.

    Each of ``n`` requests holds its connection until all ``n`` have their
    response headers, so the pool ends up with ``n`` distinct connections,
    which the workers then reuse: no measured request pays for a connect.

    The server's keep-alive clock of a connection starts when its response is
    sent, so the first connections idle while the last ones connect (seconds, on
    a busy machine at c = 64). A second round on the open connections restarts
    every clock just before the job; a connection the server closed meanwhile
    is replaced there (a GET, safe to retry), not in a measured request.
    """
    for _ in range(2):
        await _hold_round(session, n, path)


async def _hold_round(session: Any, n: int, path: str) -> None:
    """``n`` GETs, each holding its connection until all ``n`` have headers."""
    import aiohttp

    held = 0
    all_held = asyncio.Event()

    async def hold() -> None:
        nonlocal held
        for attempt in range(2):
            try:
                # It needs no engine call, so every mode answers it alike.
                async with session.get(path) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"GET {path} answered {resp.status}")
                    held += 1
                    if held >= n:
                        all_held.set()
                    await all_held.wait()
                    await resp.read()  # read to the end: back to the pool
                return
            except aiohttp.ClientConnectionError:
                if attempt:
                    raise

    await asyncio.gather(*(hold() for _ in range(n)))


# The client drops an idle connection well before the servers do (vLLM's and
# SGLang's uvicorn keep-alive timeout is 5 s): with equal timeouts a request sent
# as the server closes the connection fails with a disconnect.
_KEEPALIVE_EXPIRY_S = 2.0


def arrival_times(job: Job) -> list[float]:
    """Open loop: seconds from the job's start at which each request is sent (Poisson)."""
    rng = random.Random(f"arrivals:{job.seed}")
    t, out = 0.0, []
    for _ in range(job.requests):
        out.append(t)
        t += rng.expovariate(job.rate)
    return out


class JobRun(NamedTuple):
    """What one job measured: its wall time, its requests, the client's own CPU time."""

    wall_s: float
    samples: list[Sample]
    client_cpu_s: float  # the load generator's CPU seconds over the job's wall time


async def run_job(job: Job) -> JobRun:
    """Run ``job`` on kept-alive connections.

    Closed loop: ``concurrency`` workers send requests back to back.  Open loop
    (``rate`` > 0): requests are sent at Poisson arrival times whatever the
    server's progress, on up to ``concurrency`` connections.
    """
    samples: list[Sample] = []
    workers = min(job.concurrency, job.requests)
    async with _session(job, job.concurrency) as session:
        await _open_connections(session, workers, _WARM_PATHS[job.endpoint])
        t_job, cpu0 = time.perf_counter(), time.process_time()
        if job.rate > 0:

            async def send(i: int, at: float) -> None:
                delay = t_job + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)  # the schedule, not a wait for an event
                samples.append(await _one(session, job, i, t_job))

            await asyncio.gather(*(send(i, at) for i, at in enumerate(arrival_times(job))))
        else:
            next_i = 0

            async def worker() -> None:
                nonlocal next_i
                while next_i < job.requests:
                    i = next_i
                    next_i += 1
                    samples.append(await _one(session, job, i, t_job))

            await asyncio.gather(*(worker() for _ in range(workers)))
        wall, cpu = time.perf_counter() - t_job, time.process_time() - cpu0
    return JobRun(wall, samples, cpu)


def _child(conn: Connection) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        job = Job(**msg)
        try:
            ran = asyncio.run(run_job(job))
            conn.send(("ok", ran.wall_s, [asdict(s) for s in ran.samples], ran.client_cpu_s))
        except BaseException as exc:  # report, keep serving
            conn.send(("error", 0.0, f"{type(exc).__name__}: {exc}", 0.0))


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

    def run(self, job: Job) -> JobRun:
        self._conn.send(asdict(job))
        # The job bounds itself (per-request timeout); this bounds a wedged child.
        limit = job.timeout_s * (job.requests / max(1, job.concurrency) + 2) + 60
        if job.rate > 0:
            limit += job.requests / job.rate
        if not self._conn.poll(limit):
            raise TimeoutError(f"load generator gave no answer within {limit:.0f} s")
        status, wall, payload, cpu = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"load generator failed: {payload}")
        return JobRun(wall, [Sample(**s) for s in payload], cpu)

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
