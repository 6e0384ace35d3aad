"""What the latency benchmarks measure and write: one record per job, the rounds that
make the jobs, and the versions that produced them.

* :class:`JobRecord` - one job (one mode, one scenario, one round) and its samples;
  :func:`scenario_key` names its scenario;
  :mod:`loopbridge_bench.common.summary` reads these, ``latency.json`` holds
  :meth:`JobRecord.as_json` of each.
* :func:`rounds` - the round x scenario loop, with the mode order rotated per round
  and scenario, shared by the vLLM and SGLang benchmarks.
* :func:`versions` - the installed releases a figure comes from.

Invariants: ``ok`` and ``tokens`` are derived from the samples, never stored beside
them; a job's seed depends on the run's seed, its round and its scenario's workload only,
so every mode of one round and scenario gets the same lengths and arrivals; within a
round and scenario every mode runs once, and over ``len(modes)`` consecutive
(round, scenario) cells every mode runs first once (drift and warm-up hit every mode
alike).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Generic, TypeVar

from .load import Sample

__all__ = ["Cell", "JobRecord", "job_seed", "rounds", "scenario_key", "versions"]

S = TypeVar("S")


def scenario_key(
    stream: bool,
    c: int,
    busy: bool,
    endpoint: str = "completions",
    rate_fraction: float | None = None,
    own_loop: bool = False,
) -> str:
    """``stream-c16``, ``nostream-chat-c1-busy``, ``stream-r0.5`` (open loop, half of capacity),
    ``stream-c16-busy-own-loop`` (the busy actor on its loop, the engine on its own)."""
    load = f"r{rate_fraction:g}" if rate_fraction is not None else f"c{c}"
    chat = "-chat" if endpoint == "chat" else ""
    tail = ("-busy-own-loop" if own_loop else "-busy") if busy else ""
    return f"{'stream' if stream else 'nostream'}{chat}-{load}{tail}"


@dataclass
class JobRecord:
    """One job's figures: the scenario it ran, the mode it measured, its samples."""

    round: int
    warmup: bool
    mode: str
    stream: bool
    concurrency: int
    wall_s: float
    samples: list[Sample]
    server_cpu_s: float | None = None  # CPU seconds of the serving process during the job
    client_cpu_s: float | None = None  # CPU seconds of the load generator during the job
    engine_died: bool = False
    busy: bool = False
    own_loop: bool = False  # busy: on the actor's loop, the engine on a loop of its own
    endpoint: str = "completions"
    rate_fraction: float | None = None  # open loop: of stock's measured capacity
    offered_rps: float | None = None
    #: Per request, seconds per stage to the first token (``--stages on``; vLLM only).
    stages: list[dict[str, float]] = field(default_factory=list)
    #: The serving process's threads during the job, by group, in the order of
    #: :data:`.threads.FIELDS` (CPU s, run-queue wait s, voluntary and involuntary
    #: context switches, kernel CPU s; Linux only).
    threads: dict[str, list[float]] = field(default_factory=dict)
    #: An engine's own per-job figures, by name (SGLang: ``gc_full``, ``gc_full_s``).
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        return sum(1 for s in self.samples if s.error is None)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples if s.error is None)

    @property
    def key(self) -> str:
        """The scenario's name (``stream-c16-busy``)."""
        return scenario_key(
            self.stream,
            self.concurrency,
            self.busy,
            self.endpoint,
            self.rate_fraction,
            self.own_loop,
        )

    def as_json(self) -> dict[str, Any]:
        """The record as ``latency.json`` holds it: every field, ``ok``, ``tokens``, ``extra``'s."""
        out = asdict(self)
        extra = out.pop("extra")
        out.update(ok=self.ok, tokens=self.tokens, **extra)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobRecord:
        """The record :meth:`as_json` wrote: its fields, the rest back into ``extra``."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        kw["samples"] = [Sample(**s) for s in data["samples"]]
        kw["extra"] = {k: v for k, v in data.items() if k not in names | {"ok", "tokens"}}
        return cls(**kw)


@dataclass(frozen=True)
class Cell(Generic[S]):
    """One round of one scenario: its modes in the order they run."""

    round: int
    warmup: bool
    index: int  # the scenario's place in the round
    scenario: S
    modes: tuple[str, ...]


def rounds(
    scenarios: Sequence[S],
    modes: Sequence[str],
    *,
    rounds: int,
    warmup_rounds: int,
    first_index: int = 0,
) -> Iterator[Cell[S]]:
    """Every (round, scenario) cell, warm-up rounds first, modes rotated per cell.

    Scenario ``i`` is cell index ``first_index + i`` (a second sweep of the same
    run continues the numbering, so its seeds differ from the first's).
    """
    for rnd in range(warmup_rounds + rounds):
        for i, sc in enumerate(scenarios):
            si = first_index + i
            k = (rnd + si) % len(modes)
            yield Cell(rnd, rnd < warmup_rounds, si, sc, (*modes[k:], *modes[:k]))


def job_seed(seed: int, cell: Cell[Any], workload: str | None = None) -> int:
    """The seed of every job of ``cell``: the same lengths and arrivals for every mode.

    ``workload`` names what the draws stand for (default: the cell's place in the
    round).  Cells of one round that name the same workload draw the same lengths and
    arrivals: a busy scenario that names its idle twin's serves exactly the twin's
    requests, so the two differ by the load alone.
    """
    key = f"{seed}:{cell.round}:{cell.index if workload is None else workload}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def versions(*names: str) -> dict[str, str]:
    """The installed release of each distribution (``"?"`` when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("loopbridge", *names):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out
