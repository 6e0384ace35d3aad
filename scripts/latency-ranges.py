"""Ranges over several runs of the latency benchmark: the tables docs/performance.md quotes.

    .venv/bin/python scripts/latency-ranges.py results/quiet-1 results/quiet-2 results/quiet-3

For each scenario, over the runs (each run's ratios taken within that run): the p99s of
TTFT and e2e per mode (smallest to largest), loopbridge's ratios to stock and to
per-hop, and its throughput and CPU per request against stock; one such table for each
of loopbridge's modes the runs have (``loopbridge``, ``on-engine-loop``). With
``-busy-own-loop`` scenarios, each mode's TTFT p99 there against its own idle scenario
in the same run (the goal: within 1.10x); ``stock`` never carries the busy load, so
its column is how far two of its jobs differ alone. Then, with
``--stages on`` runs, where the slowest first tokens lose their time, pooled over
the runs (the report's tail table). Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

OURS = ("loopbridge", "on-engine-loop")
_DASH = "\u2013"  # a range, as the docs write it


def _span(xs: list[float], fmt: str) -> str:
    lo, hi = min(xs), max(xs)
    return (
        fmt.format(lo)
        if fmt.format(lo) == fmt.format(hi)
        else f"{fmt.format(lo)}{_DASH}{fmt.format(hi)}"
    )


def _rows(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for r in run["rows"]:
            out.setdefault((r["scenario"], r["mode"]), []).append(r)
    return out


def ranges_table(runs: list[dict[str, Any]], mode: str) -> list[str]:
    rows = _rows(runs)
    named = " / ".join(
        ["stock", *(["per-hop"] if any(m == "per-hop" for _, m in rows) else []), mode]
    )
    lines = [
        f"| scenario | TTFT p99 ms: {named} | ÷ stock | ÷ per-hop "
        f"| e2e p99 ms: {named} | ÷ stock | ÷ per-hop | req/s ÷ stock "
        "| CPU/req ÷ stock | client CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    scenarios = dict.fromkeys(sc for sc, m in rows if m == mode)
    for sc in scenarios:
        ours, stock, hop = rows[(sc, mode)], rows[(sc, "stock")], rows.get((sc, "per-hop"))
        cells = [sc]
        for stat in ("ttft_p99", "e2e_p99"):
            per_mode = [stock, *([hop] if hop else []), ours]
            cells.append(
                " / ".join(_span([r[stat] * 1e3 for r in rs], "{:.0f}") for rs in per_mode)
            )
            cells.append(_span([o[stat] / s[stat] for o, s in zip(ours, stock)], "{:.2f}"))
            ratio = [o[stat] / h[stat] for o, h in zip(ours, hop)] if hop else []
            cells.append(_span(ratio, "{:.2f}") if ratio else "n/a")
        cells.append(_span([o["rate_rps"] / s["rate_rps"] for o, s in zip(ours, stock)], "{:.2f}"))
        cpu = [o["cpu_per_request"] / s["cpu_per_request"] for o, s in zip(ours, stock)]
        cells.append(_span(cpu, "{:.2f}"))
        # The load generator's busiest share of a core in any mode's job of the scenario.
        client = [
            r.get("client_cpu_share", 0.0) for (s, _), rs in rows.items() if s == sc for r in rs
        ]
        cells.append(f"{max(client):.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def own_loop_table(runs: list[dict[str, Any]]) -> list[str]:
    from loopbridge_bench.vllm._report import idle_scenario

    rows = _rows(runs)
    own = {sc: idle for sc, _ in rows if (idle := idle_scenario(sc)) is not None}
    modes = [m for m in ("stock", "per-hop", *OURS) if any((sc, m) in rows for sc in own)]
    lines = [
        "| scenario | TTFT p99 ÷ the idle scenario's: " + " / ".join(modes) + " |",
        "|---|---|",
    ]
    for sc, idle in own.items():
        cells = []
        for m in modes:
            busy, calm = rows.get((sc, m), []), rows.get((idle, m), [])
            xs = [b["ttft_p99"] / c["ttft_p99"] for b, c in zip(busy, calm)]
            cells.append(_span(xs, "{:.2f}") if xs else "n/a")
        lines.append(f"| {sc} | {' / '.join(cells)} |")
    return lines if own else []


def tail_table(runs: list[dict[str, Any]]) -> list[str]:
    from loopbridge_bench.common.record import JobRecord
    from loopbridge_bench.vllm._stages import tail_markdown, tail_rows

    records = [JobRecord.from_json(rec) for run in runs for rec in run["records"]]
    return tail_markdown(tail_rows(records))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="each run's --out directory")
    args = ap.parse_args()
    runs = [json.loads((d / "latency.json").read_text()) for d in args.runs]
    loads = [run["meta"].get("load_average", {}).get("start", [None])[0] for run in runs]
    print(f"{len(runs)} runs; 1-minute load average at each start: {loads}")
    print()
    present = {r["mode"] for run in runs for r in run["rows"]}
    for mode in (m for m in OURS if m in present):
        print("\n".join(ranges_table(runs, mode)))
        print()
    own = own_loop_table(runs)
    if own:
        print("\n".join(own))
        print()
    print("\n".join(tail_table(runs)))


if __name__ == "__main__":
    main()
