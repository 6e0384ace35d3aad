"""Job records for the benchmark's tests: one builder, so a test names only the fields
it is about and every other field has the same neutral value in every test."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loopbridge_bench.common.load import Sample
from loopbridge_bench.common.record import JobRecord


def job_record(
    mode: str = "loopbridge", samples: Sequence[Sample] = (), **fields: Any
) -> JobRecord:
    """A measured job of round 0, streamed at concurrency 2, one second long, unless
    ``fields`` say otherwise (any :class:`JobRecord` field)."""
    neutral: dict[str, Any] = {
        "round": 0,
        "warmup": False,
        "stream": True,
        "concurrency": 2,
        "wall_s": 1.0,
    }
    return JobRecord(mode=mode, samples=list(samples), **(neutral | fields))
