"""Where a streamed request's first token spends its time, stage by stage.

Opt-in (``--stages on``): :class:`StageProbe` stamps each request at fifteen points
on the host's monotonic clock (``time.perf_counter``, ``CLOCK_MONOTONIC``: the same
clock in the load generator, this process and the EngineCore), keyed by the
request's number in the run, which the load generator sends as ``X-Request-Id``
(vLLM builds its request id on it):

=================  ===========================================  ==============
mark               where                                        thread
=================  ===========================================  ==============
``sent``           the client sends the request                 load process
``written``        its body goes to the socket                  load process
``http_parsed``    uvicorn has parsed the request's headers     HTTP loop
``http_in``        the ASGI app is called                       HTTP loop
``http_generate``  the serving layer calls ``generate``         HTTP loop
``owner_start``    ``AsyncLLM.generate`` starts                 owner loop [1]_
``core_queued``    the EngineCore's scheduler takes the request EngineCore [2]_
``core_scheduled`` ... and schedules it                         EngineCore [2]_
``core_out``       the EngineCore made the first token's batch  EngineCore
``handler_in``     the output handler starts processing it      owner loop
``handler_out``    ... and has put every output of that chunk   owner loop
``owner_yield``    ``AsyncLLM.generate`` yields the first token owner loop [1]_
``http_recv``      the serving layer receives it                HTTP loop
``http_body``      the first body chunk goes to the socket      HTTP loop
``first``          the client reads the first token             load process
=================  ===========================================  ==============

.. [1] the HTTP loop in the ``unsafe`` mode, which runs the engine's coroutines
   there.
.. [2] vLLM's own ``QUEUED`` and ``SCHEDULED`` events (``EngineCoreOutput.events``),
   which the EngineCore records only with stats on: ``--stages on`` turns vLLM's
   stats on in every engine of the run, stock's too (``EngineSpec.log_stats``).
   The EngineCore takes new requests only between its steps, so ``owner_start`` to
   ``core_queued`` holds the rest of the step that was running when the request
   reached it: about a whole step for a request that arrived just after a step
   began, little for one that arrived just before a step ended.

:data:`STAGES` names the gaps between consecutive marks.  Only the first mark of
each name per request counts (``dict.setdefault``, atomic under the GIL), so a
later output of the same request never moves a stage.

Invariants: with the probe off nothing is patched and nothing is recorded (no
cost); installed, the patches wrap vLLM's ``AsyncLLM.generate`` and
``OutputProcessor.process_outputs`` and the constructor of uvicorn's h11 request
cycle (made once a request's headers are parsed) at class level, in this process
only, and :meth:`StageProbe.uninstall` restores the originals.  ``written`` and
``http_parsed`` split the wait before the app: before ``written`` the request waits
in the client itself (its event loop, its connection pool); between the two, in the
kernel or in an HTTP loop that has not read it yet; after ``http_parsed``, for the
HTTP loop to run the app's task.  Closing the wrapping
generator closes vLLM's (where vLLM aborts the request), on the loop it runs on.
``vllm serve`` (stock) is another process: only its client-side marks exist, so
its rows have the client's own stage alone.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loopbridge_bench.common.load import REQUEST_ID_HEADER
from loopbridge_bench.common.record import JobRecord
from loopbridge_bench.common.summary import percentile

__all__ = [
    "STAGES",
    "TAIL_SHARE",
    "StageProbe",
    "TimedClient",
    "stage_rows",
    "stages_markdown",
    "stages_of",
    "tail_markdown",
    "tail_rows",
]

#: A table cell for a stage no request of the group has (stock: the server's stages).
_NO_DATA = "n/a"
#: The slowest share of first tokens whose stages :func:`tail_rows` takes apart.
TAIL_SHARE = 0.02

_perf = time.perf_counter
_NUMBER = re.compile(r"lb(\d+)")
_REQUEST_ID_KEY = REQUEST_ID_HEADER.lower().encode("latin-1")  # as ASGI scopes carry it


def _request_id(scope: Mapping[str, Any]) -> str | None:
    """The benchmark's request id in an HTTP scope's headers, if it has one."""
    for key, value in scope.get("headers", ()):
        if key == _REQUEST_ID_KEY:
            return str(value.decode("latin-1"))
    return None


#: (stage, from mark, to mark), in the order a request passes them.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("client before sending", "sent", "written"),
    ("sending to request parsed", "written", "http_parsed"),
    ("parsed to app call", "http_parsed", "http_in"),
    ("HTTP pre-processing", "http_in", "http_generate"),
    ("admission to owner loop", "http_generate", "owner_start"),
    ("to the engine's queue", "owner_start", "core_queued"),
    ("engine queue", "core_queued", "core_scheduled"),
    ("engine step", "core_scheduled", "core_out"),
    ("to output handler", "core_out", "handler_in"),
    ("output handler", "handler_in", "handler_out"),
    ("collector wake-up", "handler_out", "owner_yield"),
    ("pump and wake-up to HTTP loop", "owner_yield", "http_recv"),
    ("HTTP formatting", "http_recv", "http_body"),
    ("HTTP loop to client", "http_body", "first"),
)


def _number(text: str) -> int | None:
    m = _NUMBER.search(text)
    return int(m.group(1)) if m else None


@dataclass
class StageProbe:
    """The marks of every request, and the patches that make them."""

    marks: dict[int, dict[str, float]] = field(default_factory=dict)
    _restore: list[Callable[[], None]] = field(default_factory=list)

    def mark(self, request_id: str, name: str, t: float) -> None:
        n = _number(request_id)
        if n is not None:
            self.marks.setdefault(n, {}).setdefault(name, t)

    def take(self, numbers: Sequence[int]) -> dict[int, dict[str, float]]:
        """The marks of ``numbers``, removed from the probe."""
        return {n: self.marks.pop(n) for n in numbers if n in self.marks}

    # -- patches -----------------------------------------------------------------
    def install(self) -> StageProbe:
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.output_processor import OutputProcessor

        if self._restore:
            raise RuntimeError("the stage probe is already installed")
        from uvicorn.protocols.http.h11_impl import RequestResponseCycle

        self._patch(AsyncLLM, "generate", self._generate(AsyncLLM.generate))
        self._patch(OutputProcessor, "process_outputs", self._process(OutputProcessor))
        self._patch(RequestResponseCycle, "__init__", self._parsed(RequestResponseCycle))
        return self

    def uninstall(self) -> None:
        while self._restore:
            self._restore.pop()()

    def _patch(self, cls: type, name: str, new: Any) -> None:
        old = cls.__dict__[name]
        setattr(cls, name, new)
        self._restore.append(lambda: setattr(cls, name, old))

    def _generate(self, original: Any) -> Any:
        probe = self

        @functools.wraps(original)
        async def generate(
            engine: Any, prompt: Any, sampling_params: Any, request_id: str, *a: Any, **kw: Any
        ) -> AsyncGenerator[Any, None]:
            probe.mark(request_id, "owner_start", _perf())
            agen = original(engine, prompt, sampling_params, request_id, *a, **kw)
            try:
                async for out in agen:
                    probe.mark(request_id, "owner_yield", _perf())
                    yield out
            finally:
                await agen.aclose()

        return generate

    def _process(self, cls: type) -> Any:
        from vllm.v1.engine import EngineCoreEventType

        original = cls.process_outputs  # type: ignore[attr-defined]
        probe = self
        # vLLM's own event types; ``PREEMPTED`` makes no mark (and a preempted
        # request's second ``QUEUED`` moves nothing: only a first mark counts).
        marks = {
            EngineCoreEventType.QUEUED: "core_queued",
            EngineCoreEventType.SCHEDULED: "core_scheduled",
        }

        @functools.wraps(original)
        def process_outputs(
            processor: Any, outputs: Any, engine_core_timestamp: Any = None, *a: Any, **kw: Any
        ) -> Any:
            t0 = _perf()
            result = original(processor, outputs, engine_core_timestamp, *a, **kw)
            t1 = _perf()
            for out in outputs:
                rid = out.request_id
                for event in out.events or ():
                    name = marks.get(event.type)
                    if name is not None:
                        probe.mark(rid, name, event.timestamp)
                if engine_core_timestamp is not None:
                    probe.mark(rid, "core_out", engine_core_timestamp)
                probe.mark(rid, "handler_in", t0)
                probe.mark(rid, "handler_out", t1)
            return result

        return process_outputs

    def _parsed(self, cls: type) -> Any:
        original = cls.__init__  # type: ignore[misc]
        probe = self

        @functools.wraps(original)
        def __init__(cycle: Any, scope: Any, *a: Any, **kw: Any) -> None:
            rid = _request_id(scope)
            if rid is not None:
                probe.mark(rid, "http_parsed", _perf())
            original(cycle, scope, *a, **kw)

        return __init__

    def middleware(self) -> Any:
        """Starlette ``Middleware`` that marks ``http_in`` and ``http_body``."""
        from starlette.middleware import Middleware

        return Middleware(_HttpMarks, probe=self)


class _HttpMarks:
    """ASGI middleware: when a request reaches the app, and its first body chunk leaves."""

    def __init__(self, app: Any, probe: StageProbe) -> None:
        self.app = app
        self.probe = probe

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        rid = _request_id(scope) if scope["type"] == "http" else None
        if rid is None:
            await self.app(scope, receive, send)
            return
        probe = self.probe
        probe.mark(rid, "http_in", _perf())

        async def marked_send(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                probe.mark(rid, "http_body", _perf())
            await send(message)

        await self.app(scope, receive, marked_send)


class TimedClient:
    """An engine client that marks ``http_generate`` and ``http_recv`` around ``client``'s.

    Everything but ``generate`` is ``client``'s own attribute.
    """

    def __init__(self, client: Any, probe: StageProbe) -> None:
        self._client = client
        self._probe = probe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *a: Any, **kw: Any
    ) -> AsyncGenerator[Any, None]:
        self._probe.mark(request_id, "http_generate", _perf())
        inner = self._client.generate(prompt, sampling_params, request_id, *a, **kw)
        return _received(inner, self._probe, request_id)


async def _received(inner: Any, probe: StageProbe, request_id: str) -> AsyncGenerator[Any, None]:
    try:
        async for out in inner:
            probe.mark(request_id, "http_recv", _perf())
            yield out
    finally:
        await inner.aclose()


def stages_of(marks: Mapping[str, float]) -> dict[str, float]:
    """Seconds per stage of one request (the stages both of whose marks exist)."""
    return {name: marks[b] - marks[a] for name, a, b in STAGES if a in marks and b in marks}


def stage_rows(records: Sequence[JobRecord]) -> list[dict[str, Any]]:
    """p50/p99 (ms) per stage, per scenario and mode, over the measured records' requests."""
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for rec in records:
        if rec.warmup or not rec.stages:
            continue
        per = groups.setdefault((rec.key, rec.mode), {})
        for req in rec.stages:
            for name, s in req.items():
                per.setdefault(name, []).append(s)
    rows = []
    for (key, mode), per in groups.items():
        row: dict[str, Any] = {"scenario": key, "mode": mode}
        for name, _, _ in STAGES:
            xs = per.get(name, [])
            row[name] = {
                "n": len(xs),
                "p50_ms": percentile(xs, 50) * 1e3,
                "p99_ms": percentile(xs, 99) * 1e3,
            }
        rows.append(row)
    return rows


def stages_markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The stage table: one row per scenario and mode, ``p50 / p99`` ms per stage."""
    if not rows:
        return []
    names = [name for name, _, _ in STAGES]
    lines = _table_head(
        "Where the first token's time goes (`--stages on`), ms, p50 / p99 over each "
        "stage's requests (a stage's p99s do not add up to the TTFT p99):",
        ["scenario", "mode", *names],
    )
    for r in rows:
        cells = [
            _NO_DATA if not r[n]["n"] else f"{r[n]['p50_ms']:.2f} / {r[n]['p99_ms']:.2f}"
            for n in names
        ]
        lines.append(f"| {r['scenario']} | {r['mode']} | " + " | ".join(cells) + " |")
    return lines


def tail_rows(records: Sequence[JobRecord], share: float = TAIL_SHARE) -> list[dict[str, Any]]:
    """Where the slowest first tokens lose their time, per scenario and mode.

    The requests are ranked by TTFT; for the slowest ``share`` of them (at least one)
    and for the middle half, each stage's mean (ms).  A stage's ``excess_ms`` is the
    first minus the second: the stages with the largest excess are where the tail
    comes from (a p99 per stage cannot say that: each stage's p99 is another
    request's).  ``rec.stages[i]`` is the stage times of ``rec``'s i-th request
    that completed.
    """
    groups: dict[tuple[str, str], list[tuple[float, dict[str, float]]]] = {}
    for rec in records:
        if rec.warmup or not rec.stages:
            continue
        ok = [s for s in rec.samples if s.error is None]
        groups.setdefault((rec.key, rec.mode), []).extend(
            (sample.ttft, stages) for sample, stages in zip(ok, rec.stages)
        )
    rows = []
    for (key, mode), reqs in groups.items():
        reqs.sort(key=lambda r: r[0])
        n = len(reqs)
        tail, middle = reqs[n - max(1, round(n * share)) :], reqs[n // 4 : n - n // 4] or reqs
        row: dict[str, Any] = {
            "scenario": key,
            "mode": mode,
            "n": n,
            "tail_n": len(tail),
            "ttft_tail_ms": _mean_ms([t for t, _ in tail]),
            "ttft_middle_ms": _mean_ms([t for t, _ in middle]),
        }
        for name, _, _ in STAGES:
            row[name] = {
                "tail_ms": _mean_ms([st[name] for _, st in tail if name in st]),
                "middle_ms": _mean_ms([st[name] for _, st in middle if name in st]),
            }
            row[name]["excess_ms"] = row[name]["tail_ms"] - row[name]["middle_ms"]
        rows.append(row)
    return rows


def _mean_ms(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) * 1e3 if xs else float("nan")


def tail_markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The tail table: per scenario and mode, each stage's excess (ms) in the slowest
    first tokens over the middle half's, the largest in bold."""
    if not rows:
        return []
    names = [name for name, _, _ in STAGES]
    lines = _table_head(
        f"Where the slowest {TAIL_SHARE:.0%} of first tokens lose their time: each stage's "
        "mean over those requests minus its mean over the middle half, ms (the largest "
        "in bold: the tail's cause); TTFT means, slowest / middle half:",
        ["scenario", "mode", "TTFT", *names],
    )
    for r in rows:
        excess = {n: r[n]["excess_ms"] for n in names}
        top = max(names, key=lambda n: -math.inf if math.isnan(excess[n]) else excess[n])
        cells = [_excess_cell(excess[n], n == top) for n in names]
        ttft = f"{r['ttft_tail_ms']:.1f} / {r['ttft_middle_ms']:.1f}"
        lines.append(f"| {r['scenario']} | {r['mode']} | {ttft} | " + " | ".join(cells) + " |")
    return lines


def _excess_cell(ms: float, top: bool) -> str:
    if math.isnan(ms):
        return _NO_DATA
    # Bold: the largest excess, if the slowest lost any time there at all.
    return f"**{ms:+.1f}**" if top and ms > 0 else f"{ms:+.1f}"


def _table_head(caption: str, columns: Sequence[str]) -> list[str]:
    """A blank line, the caption, a blank line, then a Markdown table's header."""
    return ["", caption, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
