"""The correctness phase: the race, made certain, against the raw engine and loopbridge.

One engine of its own (never the latency rounds' engine: the unsafe run kills
its output handler) serves two OpenAI servers on their own threads: one over
the raw ``AsyncLLM``, as the downstream deployment did, and one through
loopbridge.  With :class:`CollectorSetHold` installed, every collector wake-up
whose waiter lives on the HTTP thread's loop overlaps that waiter, so the raw
engine's output handler must die with ``deque mutated during iteration``;
through loopbridge every waiter lives on the owner loop and every request must
complete.  loopbridge runs first, so that it meets a healthy engine.

Each outcome gets a named verdict; an unexpected one is reported as such, never
hidden (for instance when the amplifier did not trigger on the raw engine).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loopbridge_bench.common.console import tail
from loopbridge_bench.common.load import Job, LoadProcess, Sample

from ._amplifier import CollectorSetHold
from ._report import versions_line
from ._stack import EngineSpec, Stack

__all__ = ["Outcome", "Verdict", "correctness_markdown", "run_correctness", "verdict_lines"]

_RACE_ERROR = "deque mutated during iteration"
_HANDLER_LOGGER = "vllm.v1.engine.async_llm"  # where the output handler logs its death


class Verdict(enum.Enum):
    BROKEN = "broken: the output handler died with `deque mutated during iteration`"
    NOT_REPRODUCED = "not reproduced: the race amplifier did not break the raw engine"
    SAFE = "safe: every request completed, engine healthy"
    FAILED = "FAILED: requests were lost through loopbridge"


@dataclass
class Outcome:
    mode: str
    requests: int
    ok: int
    errors: int
    error_examples: list[str]
    engine_alive: bool
    handler_error: str | None  # the exception that killed the output handler
    collector_sets: int  # collector wake-ups the amplifier saw
    foreign_sets: int  # ... with a waiter on another thread's loop
    overlaps: int  # ... held until that waiter ran
    verdict: Verdict
    expected: bool = False  # the verdict this mode should get (BROKEN raw, SAFE ours)
    log: str | None = None  # the file with this run's engine and server logs

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.name
        out["verdict_text"] = self.verdict.value
        return out


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.causes: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.causes.append(record.exc_info[1])


def run_correctness(
    spec: EngineSpec,
    load: LoadProcess,
    *,
    requests: int,
    concurrency: int,
    timeout_s: float,
    first_id: int = 0,
    kv: dict[str, Any] | None = None,
    log: Callable[[str], Path | None] | None = None,
) -> list[Outcome]:
    """Run loopbridge, then the raw engine, with the amplifier on; the engine is gone after.

    Its ``2 * requests`` prompts are the run's requests ``first_id`` onwards;
    ``kv`` receives the engine's KV-cache size.  ``log(name)``, when given, sends
    what is logged from then on to the file it returns: ``correctness-loopbridge``
    (the engine's start-up and loopbridge's run) and ``correctness-unsafe`` (the
    raw engine's run, its crash and the shutdown).
    """
    files: dict[str, Path | None] = {}

    def phase(mode: str) -> None:
        files[mode] = log(f"correctness-{mode}") if log is not None else None

    stack = Stack(
        replace(spec, max_num_seqs=max(spec.max_num_seqs, concurrency)), ("loopbridge", "unsafe")
    )
    errors = _Errors()
    handler_log = logging.getLogger(_HANDLER_LOGGER)
    outcomes: list[Outcome] = []
    phase("loopbridge")
    stack.start()
    if kv is not None:
        kv.update(stack.kv_cache())
    try:
        handler_log.addHandler(errors)
        for n, mode in enumerate(("loopbridge", "unsafe")):
            if mode not in files:
                phase(mode)
            job = Job(
                url=stack.url(mode),
                model=stack.served_name,
                requests=requests,
                concurrency=concurrency,
                prompt_len=8,
                output_len=8,
                stream=False,
                timeout_s=timeout_s,
                first_id=first_id + n * requests,
            )
            with CollectorSetHold() as hook:
                samples = load.run(job).samples
            log_path = None if files[mode] is None else str(files[mode])
            outcomes.append(_outcome(mode, samples, stack.healthy, errors, hook, log_path))
    finally:
        handler_log.removeHandler(errors)
        stack.stop()
    return outcomes


def _outcome(
    mode: str,
    samples: list[Sample],
    alive: bool,
    errors: _Errors,
    hook: CollectorSetHold,
    log: str | None,
) -> Outcome:
    """One mode's verdict: loopbridge must be safe; the raw engine must break by the race."""
    bad = [s.error for s in samples if s.error is not None]
    race = next((c for c in errors.causes if _RACE_ERROR in str(c)), None)
    cause = race or (errors.causes[0] if errors.causes else None)
    if mode == "loopbridge":
        verdict = Verdict.SAFE if not bad and alive else Verdict.FAILED
        expected = verdict is Verdict.SAFE
    else:
        verdict = Verdict.BROKEN if race is not None and not alive else Verdict.NOT_REPRODUCED
        expected = verdict is Verdict.BROKEN
    return Outcome(
        mode=mode,
        requests=len(samples),
        ok=len(samples) - len(bad),
        errors=len(bad),
        error_examples=sorted(set(bad))[:3],
        engine_alive=alive,
        handler_error=None if cause is None else f"{type(cause).__name__}: {cause}",
        collector_sets=hook.collector_sets,
        foreign_sets=hook.foreign_sets,
        overlaps=hook.overlaps,
        verdict=verdict,
        expected=expected,
        log=log,
    )


#: What each mode is, in the verdict lines.
_MODE_NAMES = {
    "unsafe": "unsafe (raw engine shared across loops)",
    "loopbridge": "loopbridge (engine proxy)",
}


def verdict_lines(outcomes: list[Outcome]) -> list[str]:
    """One line per outcome for the terminal; an unexpected one also shows its log's end."""
    lines = []
    for o in outcomes:
        name = _MODE_NAMES.get(o.mode, o.mode)
        where = f"see {o.log}" if o.log else "its log is in the output above"
        counts = f"{o.ok} of {o.requests} requests completed"
        if o.verdict is Verdict.BROKEN:
            text = (
                f"failed as expected: {o.handler_error}; engine dead, {counts}, "
                f"{o.overlaps} wake-ups held by the amplifier"
            )
        elif o.verdict is Verdict.SAFE:
            text = (
                f"passed as expected: every request completed ({o.ok} of {o.requests}), "
                "engine healthy"
            )
        elif o.verdict is Verdict.NOT_REPRODUCED:
            text = (
                f"UNEXPECTED: {o.verdict.value} ({counts}, engine "
                f"{'healthy' if o.engine_alive else 'dead'}, output handler "
                f"{o.handler_error or 'running'}, {o.overlaps} of {o.collector_sets} "
                "wake-ups held)"
            )
        else:
            text = (
                f"UNEXPECTED: {o.verdict.value}: {o.errors} of {o.requests} requests failed "
                f"(e.g. {'; '.join(o.error_examples) or '-'}), engine "
                f"{'healthy' if o.engine_alive else 'dead'}, output handler "
                f"{o.handler_error or 'running'}"
            )
        lines.append(f"correctness, {name}: {text}; {where}")
        if not o.expected and o.log:
            lines += [f"  | {line}" for line in tail(Path(o.log), 15)]
    return lines


def correctness_markdown(outcomes: list[Outcome], meta: dict[str, Any]) -> str:
    """The phase's table, with the versions that produced it."""
    lines = [
        "Correctness phase: the race amplifier (`CollectorSetHold`) on, "
        f"{outcomes[0].requests if outcomes else 0} non-streaming requests per mode, "
        f"c = {meta['correctness']['concurrency']}, one engine of its own; "
        f"{meta['correctness'].get('elapsed_s', 0.0):.0f} s with its start-up. "
        f"{versions_line(meta)}",
        "",
        "| mode | ok / requests | engine after | output handler | foreign wake-ups held | verdict | as expected |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.mode} | {o.ok} / {o.requests} | {'healthy' if o.engine_alive else 'dead'} | "
            f"{o.handler_error or 'running'} | {o.overlaps} of {o.collector_sets} | "
            f"{o.verdict.value} | {'yes' if o.expected else '**no**'} |"
        )
    return "\n".join(lines)
