"""The SGLang benchmark's report: the setting, absolute figures, ratios, the targets.

Rows come from :func:`loopbridge_bench.common.summary.summarize`; ratios are
``loopbridge / stock`` of the same scenario, measured interleaved in one run.
"""

from __future__ import annotations

from typing import Any

from loopbridge_bench.common.summary import (
    STOCK_TARGETS,
    check_targets,
    errors_check,
    job_lines,
    ms,
    three,
    times,
)
from loopbridge_bench.common.threads import thread_lines

__all__ = ["markdown", "target_checks", "terminal_report"]

#: ``(label, row key, streaming only)`` of the ratios reported and checked.
_RATIOS = (
    ("TTFT p50", "ttft_p50_vs_stock", True),
    ("TTFT p99", "ttft_p99_vs_stock", True),
    ("ITL p50", "itl_p50_vs_stock", True),
    ("ITL p99", "itl_p99_vs_stock", True),
    ("e2e p50", "e2e_p50_vs_stock", False),
    ("e2e p99", "p99_vs_stock", False),
    ("req/s", "rate_vs_stock", False),
    ("CPU/req", "cpu_per_request_vs_stock", False),
)


def target_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets, as for vLLM: loopbridge's TTFT (streaming) and e2e p50 and p99
    within 1.05x stock, request rate at least 0.98x stock, and no errors."""
    out: list[dict[str, Any]] = []
    for r in rows:
        if r["mode"] == "loopbridge":
            out += check_targets(r, STOCK_TARGETS)
            out.append(errors_check(r))
    return out


def _setting(meta: dict[str, Any]) -> str:
    v = meta["versions"]
    loads = meta.get("load_average", {})
    start, end = (", ".join(f"{x:.2f}" for x in loads.get(k, ())) or "?" for k in ("start", "end"))
    return (
        f"SGLang {v.get('sglang', '?')}, uvicorn {v.get('uvicorn', '?')}, uvloop "
        f"{v.get('uvloop', '?')}, Python {meta['python']}, loopbridge {v.get('loopbridge', '?')}; "
        f"{meta['cpus']} CPUs, load average {start} at the start and {end} at the end. "
        "SGLang's real "
        f"TokenizerManager (config-only tiny model, no tokenizer) against the stand-in "
        f"scheduler, {meta['step_ms']:g} ms per step; `POST /generate`, prompt "
        f"{meta['prompt_len']} tokens, output {meta['output_len']} tokens; "
        f"{meta['requests']} requests per mode per round, {meta['rounds']} measured rounds "
        f"after {meta['warmup_rounds']} warm-up, kept-alive connections (one per worker). "
        "stock = SGLang's app on the manager's own loop (launch_server's topology); "
        "loopbridge = the app on its own thread, the manager through its proxy. "
        "Latencies in ms, pooled over rounds, as p50 / p99 / max; without streaming, TTFT "
        "is the whole response. CPU = this process's CPU ms per request (the stand-in "
        "scheduler is a process of its own)."
    )


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| scenario | mode | req/s | TTFT | ITL | e2e | CPU ms/req | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['mode']} | {r['rate_rps']:.2f} | {three(r, 'ttft')} | "
            f"{three(r, 'itl')} | {three(r, 'e2e')} | {ms(r['cpu_per_request'])} | "
            f"{r['errors']} |"
        )
    return lines


def headlines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per scenario: loopbridge / stock."""
    out = []
    for r in rows:
        if r["mode"] != "loopbridge":
            continue
        parts = [
            f"{label} {times(r.get(key)) or '-'}"
            for label, key, streaming in _RATIOS
            if r["stream"] or not streaming
        ]
        out.append(
            f"{r['scenario']}: loopbridge vs stock: {', '.join(parts)}; {r['errors']} errors"
        )
    return out


def _targets(rows: list[dict[str, Any]], every: bool) -> list[str]:
    checks = target_checks(rows)
    met = sum(1 for c in checks if c["met"])
    lines = [f"Targets: {met} of {len(checks)} met."]
    if every:
        lines += ["", "| scenario | target (loopbridge) | measured | met |", "|---|---|---|---|"]
        lines += [
            f"| {c['scenario']} | {c['what']} | {c['value']} | {'yes' if c['met'] else '**no**'} |"
            for c in checks
        ]
    else:
        lines += [
            f"  missed in {c['scenario']}: {c['what']} ({c['value']})"
            for c in checks
            if not c["met"]
        ]
    return lines


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """``latency.md``: the setting, headlines, the tables, the targets, the command."""
    lines = [_setting(meta), "", *headlines(rows), "", *_table(rows), ""]
    lines += ["loopbridge / stock, same scenario, measured interleaved:", ""]
    lines += [
        "| scenario | " + " | ".join(label for label, _, _ in _RATIOS) + " |",
        "|---|" + "---|" * len(_RATIOS),
    ]
    for r in rows:
        if r["mode"] == "loopbridge":
            cells = [times(r.get(key)) for _, key, _ in _RATIOS]
            lines.append(f"| {r['scenario']} | {' | '.join(cells)} |")
    lines += job_lines(rows)
    lines += thread_lines(rows)
    lines += ["", *_targets(rows, every=True)]
    lines += ["", f"Command: `python -m loopbridge_bench.sglang {' '.join(meta['argv'])}`".rstrip()]
    return "\n".join(lines)


def terminal_report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The terminal's share: the setting, headlines, the table, the targets missed."""
    return [_setting(meta), "", *headlines(rows), "", *_table(rows), "", *_targets(rows, False)]
