"""Statistics over the load generator's samples: percentiles, rows per scenario and
mode, ratios between modes measured in the same run, and their formatting.

A record is one job: a :class:`~loopbridge_bench.common.record.JobRecord`.  Invariants:
warm-up records never count; a ratio compares two modes of one scenario (rounds
interleave the modes, so drift hits both); a ratio against a baseline below
:data:`RATIO_FLOOR` or against no data is NaN, never a number.

A target check is ``{"scenario", "what", "value", "met"}``; a target whose ratio is
NaN is not checked (no row), never counted as met.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .threads import per_request

if TYPE_CHECKING:
    from .load import Sample
    from .record import JobRecord

__all__ = [
    "CLIENT_BUSY_SHARE",
    "COMPARED",
    "RATIO_FLOOR",
    "STOCK_TARGETS",
    "Target",
    "check_targets",
    "client_line",
    "client_share",
    "errors_check",
    "job_lines",
    "ms",
    "percentile",
    "ratio",
    "rec_key",
    "summarize",
    "three",
    "times",
    "request_tpot",
]


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (``q`` in 0..100); NaN for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rec_key(rec: JobRecord) -> str:
    return rec.key


#: Statistics compared with the baselines, as ``{stat}_vs_{baseline}``.
COMPARED = (
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "itl_p50",
    "itl_p99",
    "itl_max",
    "e2e_p50",
    "cpu_per_request",
)


def request_tpot(s: Sample) -> float | None:
    """Time per output token after the first: vLLM's ``bench serve`` definition."""
    if s.tokens < 2:
        return None
    return float((s.e2e - s.ttft) / (s.tokens - 1))


def summarize(
    records: Sequence[JobRecord], modes: Sequence[str], baselines: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per (scenario, mode): pooled percentiles over all measured rounds.

    ``records`` hold one entry per (round, scenario, mode) with that round's
    samples.  Latency percentiles pool every successful request of the mode in
    that scenario (ITL pools every gap); the request rate is the median over
    rounds; server CPU is per successful request over all rounds.  Ratios
    compare modes of the same scenario, so drift hits both sides alike (rounds
    interleave the modes).  Rows come in ``modes`` order within a scenario; each row
    gets ``{stat}_vs_{baseline}`` ratios against every mode of ``baselines`` present
    (the baseline's name without dashes: ``per-hop`` gives ``_vs_perhop``).
    """
    rows = [_row(key[-1], recs) for key, recs in sorted(_groups(records, modes).items())]
    _add_ratios(rows, baselines)
    return rows


def _groups(
    records: Sequence[JobRecord], modes: Sequence[str]
) -> dict[tuple[Any, ...], list[JobRecord]]:
    """The measured records by scenario and mode, keyed in the order rows are listed."""
    groups: dict[tuple[Any, ...], list[JobRecord]] = {}
    order = {m: i for i, m in enumerate(modes)}
    for rec in records:
        if rec.warmup:
            continue
        rf = rec.rate_fraction
        key = (
            rec.busy,
            rec.own_loop,
            rec.endpoint != "completions",
            rf is not None,
            not rec.stream,
            rf or 0.0,
            rec.concurrency,
            order.get(rec.mode, 9),
            rec.mode,
        )
        groups.setdefault(key, []).append(rec)
    return groups


def _row(mode: str, recs: list[JobRecord]) -> dict[str, Any]:
    """One scenario's and mode's row: pooled percentiles, rates, CPU per request."""
    first = recs[0]
    ok = [s for r in recs for s in r.samples if s.error is None]
    errors = [s.error for r in recs for s in r.samples if s.error is not None]
    e2e = [s.e2e for s in ok]
    ttft = [s.ttft for s in ok]
    tpot = [t for t in map(request_tpot, ok) if t is not None] if first.stream else []
    itl = [x for s in ok for x in s.itl]
    rates = [r.ok / r.wall_s for r in recs if r.wall_s > 0]
    tok_rates = [r.tokens / r.wall_s for r in recs if r.wall_s > 0]
    cpu = [r.server_cpu_s for r in recs if r.server_cpu_s is not None]
    client = [(r.client_cpu_s, r.wall_s) for r in recs if r.client_cpu_s is not None]
    per_job = [[s for s in r.samples if s.error is None] for r in recs]
    p99_rounds = [percentile([s.e2e for s in job], 99) for job in per_job]
    ttft_rounds = [
        [percentile(xs, 50), percentile(xs, 99)]
        for xs in ([s.ttft for s in job] for job in per_job)
    ]
    cpu_rounds = [
        [_per_request(r.server_cpu_s, len(job)), _per_request(r.client_cpu_s, len(job))]
        for r, job in zip(recs, per_job)
    ]
    row: dict[str, Any] = {
        "scenario": first.key,
        "stream": first.stream,
        "concurrency": first.concurrency,
        "busy": first.busy,
        "own_loop": first.own_loop,
        "endpoint": first.endpoint,
        "rate_fraction": first.rate_fraction,
        "offered_rps": first.offered_rps,
        "mode": mode,
        "rounds": len(recs),
        "requests": sum(len(r.samples) for r in recs),
        "ok": len(ok),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "engine_died": sum(1 for r in recs if r.engine_died),
        "rate_rps": statistics.median(rates) if rates else math.nan,
        "rate_rps_rounds": rates,
        "tokens_per_s": statistics.median(tok_rates) if tok_rates else math.nan,
        "cpu_per_request": sum(cpu) / len(ok) if cpu and ok else math.nan,
        # The load generator's CPU seconds per second of the jobs (1.0: a whole core):
        # near 1, the client, not the server, sets the latencies.
        "client_cpu_share": client_share(client),
        "e2e_p99_rounds": p99_rounds,
        # Each job's TTFT p50 and p99, in round order: a job that ran slower than its
        # neighbours throughout shows here, where the pooled figures hide it.
        "ttft_rounds": ttft_rounds,
        # Each job's CPU seconds per successful request, in the serving process and in
        # the load generator: the client does the same work in every job, so its
        # figure gauges the machine (more CPU for the same work in a slow period).
        "cpu_rounds": cpu_rounds,
        # The serving process's threads per successful request, by group (Linux's
        # scheduler statistics: where a wait for the GIL or for a core shows).
        "threads_per_request": per_request([(r.threads, r.ok) for r in recs]),
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for q in (50, 95, 99):
            row[f"{name}_p{q}"] = percentile(xs, q)
        row[f"{name}_max"] = max(xs) if xs else math.nan
    return row


def _per_request(cpu_s: float | None, ok: int) -> float:
    return cpu_s / ok if cpu_s is not None and ok else math.nan


def job_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A table of each job's TTFT p50 / p99 and CPU per request in round order, for rows
    of more than one job, after a blank line (none of either when no row has more than
    one job).

    The pooled percentiles weigh every job alike; a job that ran slower throughout (a
    slow period of the machine, which a closed loop feeds back into every next request)
    moves them, and this table shows which jobs did.  The CPU figures tell a slow
    period from a slow server: in a slow period every process needs more CPU for the
    same work, the load generator too, whose work is the same in every job.
    """
    multi = [r for r in rows if len(r.get("ttft_rounds", ())) > 1]
    if not multi:
        return []
    lines = [
        "",
        "Each job in round order: TTFT p50 / p99, ms, and in brackets CPU ms per request",
        "of the serving process and of the load generator (the same work in every job, so",
        "a gauge of the machine):",
        "",
        "| scenario | mode | jobs |",
        "|---|---|---|",
    ]
    for r in multi:
        jobs = ", ".join(
            f"{ms(p50)} / {ms(p99)}{_cpu_cell(server, client)}"
            for (p50, p99), (server, client) in zip(r["ttft_rounds"], r["cpu_rounds"])
        )
        lines.append(f"| {r['scenario']} | {r['mode']} | {jobs} |")
    return lines


def _cpu_cell(server: float, client: float) -> str:
    """`` (server, client)`` in ms per request, ``-`` for a figure not measured;
    nothing when neither was."""
    if math.isnan(server) and math.isnan(client):
        return ""
    return f" ({ms(server)}, {ms(client)})"


def client_share(jobs: Sequence[tuple[float, float]]) -> float:
    """The client's CPU seconds over the jobs' wall seconds, from ``(cpu_s, wall_s)`` pairs."""
    wall = sum(w for _, w in jobs)
    return sum(c for c, _ in jobs) / wall if wall > 0 else math.nan


#: A load generator busier than this (share of one core) may delay its own requests.
CLIENT_BUSY_SHARE = 0.5


def client_line(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line: the busiest the load generator was, and a warning if it was busy."""
    shares = [(r["client_cpu_share"], r) for r in rows if not math.isnan(r["client_cpu_share"])]
    if not shares:
        return []
    share, r = max(shares, key=lambda x: x[0])
    line = f"The load generator used at most {share:.0%} of a core ({r['scenario']}, {r['mode']})"
    if share > CLIENT_BUSY_SHARE:
        return [
            f"{line}: above {CLIENT_BUSY_SHARE:.0%}, it may delay its own requests, so "
            "its latencies say more about the client than the servers."
        ]
    return [f"{line}."]


def _add_ratios(rows: list[dict[str, Any]], baselines: Sequence[str]) -> None:
    """Each row's ``{stat}_vs_{baseline}`` against the baselines' rows of its scenario."""
    by = {(r["scenario"], r["mode"]): r for r in rows}
    for r in rows:
        for base in baselines:
            b = by.get((r["scenario"], base))
            if b is None or b is r:
                continue
            tag = base.replace("-", "")
            for stat in COMPARED:
                r[f"{stat}_vs_{tag}"] = ratio(r[stat], b[stat])
            r[f"p99_vs_{tag}"] = ratio(r["e2e_p99"], b["e2e_p99"])
            r[f"rate_vs_{tag}"] = ratio(r["rate_rps"], b["rate_rps"])
            paired = [ratio(x, y) for x, y in zip(r["e2e_p99_rounds"], b["e2e_p99_rounds"])]
            paired = [x for x in paired if not math.isnan(x)]
            r[f"p99_vs_{tag}_round_median"] = statistics.median(paired) if paired else math.nan


#: Below this (seconds) a baseline is timer noise, not a time: no ratio against it.
#: Stream events that arrive in one read have gaps of zero, so an ITL p50 can be 0.
RATIO_FLOOR = 1e-4


def ratio(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b) or b < RATIO_FLOOR:
        return math.nan
    return a / b


def ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.0f}" if x >= 0.1 else f"{x * 1e3:.1f}"


def times(x: float | None) -> str:
    return "" if x is None or math.isnan(x) else f"{x:.2f}x"


def three(r: dict[str, Any], name: str) -> str:
    return " / ".join(ms(r[f"{name}_{q}"]) for q in ("p50", "p99", "max"))


#: A target on a ratio: ``(what, row key, limit, at least (else at most), streaming only)``.
Target = tuple[str, str, float, bool, bool]

#: loopbridge against the engine's stock server: TTFT (streaming only; without streaming
#: TTFT is the response, which the e2e targets cover) and e2e p50 and p99 within 1.05x,
#: request rate at least 0.98x.
STOCK_TARGETS: tuple[Target, ...] = (
    ("TTFT p50 ≤ 1.05x stock", "ttft_p50_vs_stock", 1.05, False, True),
    ("TTFT p99 ≤ 1.05x stock", "ttft_p99_vs_stock", 1.05, False, True),
    ("e2e p50 ≤ 1.05x stock", "e2e_p50_vs_stock", 1.05, False, False),
    ("e2e p99 ≤ 1.05x stock", "p99_vs_stock", 1.05, False, False),
    ("req/s ≥ 0.98x stock", "rate_vs_stock", 0.98, True, False),
)


def check_targets(r: dict[str, Any], targets: Sequence[Target]) -> list[dict[str, Any]]:
    """Row ``r``'s checks of ``targets``, in their order; a NaN or missing ratio is skipped."""
    out: list[dict[str, Any]] = []
    for what, key, limit, at_least, stream_only in targets:
        value = r.get(key, math.nan)
        if (stream_only and not r["stream"]) or math.isnan(value):
            continue
        met = value >= limit if at_least else value <= limit
        out.append({"scenario": r["scenario"], "what": what, "value": f"{value:.2f}x", "met": met})
    return out


def errors_check(r: dict[str, Any]) -> dict[str, Any]:
    """Row ``r``'s "zero errors" check."""
    return {
        "scenario": r["scenario"],
        "what": "zero errors",
        "value": str(r["errors"]),
        "met": r["errors"] == 0,
    }
