"""The Markdown table, the target checks and the plots of the latency benchmark.

The statistics are :mod:`loopbridge_bench.common.summary`'s (shared with the SGLang
benchmark), over this benchmark's modes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loopbridge_bench.common import summary
from loopbridge_bench.common.record import JobRecord, scenario_key
from loopbridge_bench.common.summary import COMPARED as _COMPARED
from loopbridge_bench.common.summary import (
    STOCK_TARGETS,
    Target,
    check_targets,
    client_line,
    errors_check,
    job_lines,
    percentile,
    ratio,
)
from loopbridge_bench.common.summary import ms as _ms
from loopbridge_bench.common.summary import three as _three
from loopbridge_bench.common.summary import times as _x
from loopbridge_bench.common.threads import thread_lines

from ._stack import BUSY_WORK, OURS

__all__ = [
    "headlines",
    "idle_scenario",
    "markdown",
    "percentile",
    "plot",
    "scenario_key",
    "summarize",
    "target_checks",
    "terminal_report",
    "versions_line",
]

MODE_COLORS = {
    "stock": "#000000",
    "unsafe": "#7f7f7f",
    "per-hop": "#d62728",
    "loopbridge": "#1f77b4",
    "on-engine-loop": "#2ca02c",
}
#: What the threaded modes are compared with: ``vllm serve`` itself, then the unsafe original.
BASELINES = ("stock", "unsafe", "per-hop")


def summarize(records: Sequence[JobRecord]) -> list[dict[str, Any]]:
    """:func:`loopbridge_bench.common.summary.summarize` with this benchmark's modes,
    compared with ``stock``, ``unsafe`` and ``per-hop``."""
    return summary.summarize(records, tuple(MODE_COLORS), BASELINES)


def versions_line(meta: dict[str, Any]) -> str:
    """Which releases produced a figure: every table and plot carries this."""
    v = meta["versions"]
    line = (
        f"vLLM {v.get('vllm', '?')}, torch {v.get('torch', '?')}, Python {meta['python']}, "
        f"loopbridge {v.get('loopbridge', '?')}"
    )
    stock = meta.get("stock_vllm_version")
    if stock:
        line += f"; the stock server reported vLLM {stock}"
    gpus = meta.get("gpus")
    if gpus:
        names = sorted({g["name"] for g in gpus})
        line += f"; {len(gpus)} GPU{'s' if len(gpus) > 1 else ''} ({', '.join(names)})"
    return line + "."


def headlines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per scenario: loopbridge against stock (or the first baseline present)."""
    out = []
    for r in rows:
        if r["mode"] not in OURS:
            continue
        base = next((b for b in BASELINES if f"rate_vs_{b.replace('-', '')}" in r), None)
        if base is None:
            continue
        tag = base.replace("-", "")
        parts = [
            f"{label} {_x(r.get(f'{stat}_vs_{tag}')) or '-'}"
            for label, stat in (
                ("TTFT p50", "ttft_p50"),
                ("TTFT p99", "ttft_p99"),
                ("TPOT p50", "tpot_p50"),
                ("ITL p99", "itl_p99"),
                ("e2e p99", "p99"),
                ("req/s", "rate"),
                ("CPU/req", "cpu_per_request"),
            )
            if r["stream"] or stat not in ("ttft_p50", "ttft_p99", "tpot_p50", "itl_p99")
        ]
        out.append(
            f"{r['scenario']}: {r['mode']} vs {base}: {', '.join(parts)}; {r['errors']} errors"
        )
    return out


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """``latency.md``: the setting, headlines, the table, the ratios, the targets, the command."""
    lines = _intro(rows, meta)
    lines += [
        "",
        "Against `stock` (`vllm serve`) in the same scenario, measured interleaved:",
        "",
        "| scenario | mode | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | ITL p99 "
        "| ITL max | e2e p50 | e2e p99 | req/s | CPU/req | e2e p99 vs per-hop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["mode"] == "stock":
            continue
        cells = [_x(r.get(f"{stat}_vs_stock")) for stat in _COMPARED[:-2]]
        lines.append(
            f"| {r['scenario']} | {r['mode']} | {' | '.join(cells)} | "
            f"{_x(r.get('e2e_p50_vs_stock'))} | {_x(r.get('p99_vs_stock'))} | "
            f"{_x(r.get('rate_vs_stock'))} | {_x(r.get('cpu_per_request_vs_stock'))} | "
            f"{_x(r.get('p99_vs_perhop'))} |"
        )
    lines += job_lines(rows)
    lines += thread_lines(rows)
    checks = target_checks(rows)
    if checks:
        met = sum(1 for c in checks if c["met"])
        lines += [
            "",
            f"Targets: {met} of {len(checks)} met.",
            "",
            "| scenario | target (loopbridge) | measured | met |",
            "|---|---|---|---|",
        ]
        for c in checks:
            lines.append(
                f"| {c['scenario']} | {c['what']} | {c['value']} | {'yes' if c['met'] else '**no**'} |"
            )
    lines += ["", f"Command: `python -m loopbridge_bench.vllm {' '.join(meta['argv'])}`".rstrip()]
    return "\n".join(lines)


def terminal_report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The terminal's share of :func:`markdown`: the setting, the headlines, the table, and
    the targets missed, one line per scenario (the ratios and every target: latency.md)."""
    lines = _intro(rows, meta)
    checks = target_checks(rows)
    if checks:
        met = sum(1 for c in checks if c["met"])
        lines += ["", f"Targets: {met} of {len(checks)} met (every ratio and target: latency.md)."]
        missed: dict[str, list[str]] = {}
        for c in checks:
            if not c["met"]:
                missed.setdefault(c["scenario"], []).append(f"{c['what']} ({c['value']})")
        lines += [f"  missed in {sc}: {', '.join(whats)}" for sc, whats in missed.items()]
    return lines


def _threaded_setup(meta: dict[str, Any]) -> str:
    """The threaded modes' owner loop and switch interval, where the run recorded them."""
    parts = []
    if meta.get("owner_loop"):
        parts.append(f"engine owner loop {meta['owner_loop']}")
    if "switch_interval_ms" in meta:
        ms = meta["switch_interval_ms"]
        parts.append(f"switch interval {ms:g} ms while serving")
    if "gc_full_collections" in meta:
        frozen = "frozen" if meta.get("gc_frozen_between_jobs") else "not frozen (`--no-gc-freeze`)"
        parts.append(
            f"{meta['gc_full_collections']} full GC collections in this process during their "
            f"measured jobs, {meta['gc_full_s'] * 1e3:.0f} ms in all (the run's records {frozen} "
            "between jobs)"
        )
    return f" Threaded modes: {', '.join(parts)}." if parts else ""


def _busy_setup(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The busy actor's load, where the run has busy scenarios."""
    load = meta.get("busy_load")
    if not load or not any(r["busy"] for r in rows):
        return ""
    work = load.get("work", "python")
    describes = BUSY_WORK[work].describes if work in BUSY_WORK else "?"
    text = (
        f" Busy actor: a {load['slice_s'] * 1e3:g} ms slice every {load['period_s'] * 1e3:g} ms "
        f"blocks its loop (`--busy-work {work}`: {describes})"
    )
    if load["refit_every_s"] > 0:
        text += (
            f", and generation pauses for {load['refit_pause_s'] * 1e3:g} ms every "
            f"{load['refit_every_s']:g} s (a refit)"
        )
    return text + "."


def _intro(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    lengths = meta.get("lengths", "fixed")
    if lengths == "fixed":
        shape = f"Prompt {meta['prompt_len']} tokens, output {meta['output_len']} tokens"
    else:
        lb = meta["length_bounds"]
        shape = (
            f"Lengths {lengths}: prompt median {meta['prompt_len']} tokens "
            f"({lb['prompt'][0]}..{lb['prompt'][1]}), output median {meta['output_len']} "
            f"({lb['output'][0]}..{lb['output'][1]})"
        )
    pc = meta.get("prefix_cache") or {}
    cache = "Prefix caching off; every prompt unique."
    if pc.get("enabled"):
        hit = pc.get("expected_hit_rate")
        cache = (
            f"Prefix caching on, {pc.get('shared_prefix_tokens', 0)}-token shared prefix: "
            f"expected hit rate {'?' if hit is None else f'{hit:.0%}'} of prompt tokens."
        )
    lines = [
        f"{versions_line(meta)} {shape}; {meta['requests']} requests per mode per round, "
        f"{meta['rounds']} measured rounds, kept-alive connections (one per worker, opened "
        f"before the clock starts). {cache}{_threaded_setup(meta)}{_busy_setup(rows, meta)} "
        "Latencies in ms, pooled over rounds, as "
        "p50 / p99 / max; without streaming, TTFT is the whole response and there is no "
        "TPOT or ITL. TPOT = (e2e - TTFT) / (tokens - 1) per request; ITL = gaps between "
        "streamed events. rate = median requests/s over rounds; CPU = the serving "
        "process's CPU ms per request (stock: `vllm serve`'s API process; threaded: this "
        "process). `rN` scenarios are open loop: Poisson arrivals at N times stock's "
        "measured capacity.",
    ]
    lines += [
        "",
        *headlines(rows),
        "",
        "| scenario | mode | req/s | TTFT | TPOT | ITL | e2e | CPU ms/req | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = str(r["errors"]) + (f" (engine died {r['engine_died']}x)" if r["engine_died"] else "")
        lines.append(
            f"| {r['scenario']} | {r['mode']} | {r['rate_rps']:.2f} | {_three(r, 'ttft')} | "
            f"{_three(r, 'tpot')} | {_three(r, 'itl')} | {_three(r, 'e2e')} | "
            f"{_ms(r['cpu_per_request'])} | {err} |"
        )
    return [*lines, "", *client_line(rows)]


#: loopbridge against the raw engine (idle owner only), and against the per-hop fix.
_UNSAFE_TARGETS: tuple[Target, ...] = (
    ("p99 ≤ 1.05x unsafe", "p99_vs_unsafe", 1.05, False, False),
    ("req/s ≥ 0.98x unsafe", "rate_vs_unsafe", 0.98, True, False),
)
_PERHOP_TARGETS: tuple[Target, ...] = (("p99 ≤ 0.8x per-hop", "p99_vs_perhop", 0.8, False, False),)
#: A busy actor on a loop of its own must not delay the engine: the first token's p99
#: (the response's, without streaming) within this of the same mode's idle scenario.
_OWN_LOOP_LIMIT = 1.10
_OWN_LOOP = "-busy-own-loop"


def idle_scenario(scenario: str) -> str | None:
    """The idle scenario a ``-busy-own-loop`` scenario is compared with; None for others."""
    return scenario[: -len(_OWN_LOOP)] if scenario.endswith(_OWN_LOOP) else None


def _own_loop_check(r: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Row ``r``'s check against its idle scenario, where ``r`` is a ``-busy-own-loop``
    row and the run has that scenario for its mode."""
    idle_name = idle_scenario(r["scenario"])
    if idle_name is None:
        return []
    key = (idle_name, r["mode"])
    idle = next((x for x in rows if (x["scenario"], x["mode"]) == key), None)
    if idle is None:
        return []
    stat = "ttft_p99" if r["stream"] else "e2e_p99"
    value = ratio(r[stat], idle[stat])
    what = f"{'TTFT' if r['stream'] else 'e2e'} p99 ≤ {_OWN_LOOP_LIMIT:.2f}x idle"
    met = value <= _OWN_LOOP_LIMIT
    return [{"scenario": r["scenario"], "what": what, "value": f"{value:.2f}x", "met": met}]


def target_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The project's HTTP targets, checked for every scenario that has the modes.

    Against stock (idle owner only: ``vllm serve`` has no owner loop to load):
    p50 and p99 of TTFT (streaming; without streaming TTFT is the response, so
    the e2e checks cover it) and of e2e within 1.05x, request rate at least
    0.98x.  Against the raw engine and the per-hop fix as before.  With the busy
    actor on a loop of its own, the engine's loop: TTFT p99 within 1.10x of the same
    mode's idle scenario.
    """
    out: list[dict[str, Any]] = []
    for r in rows:
        if r["mode"] not in OURS:
            continue
        checks = check_targets(r, _PERHOP_TARGETS) + _own_loop_check(r, rows)
        if not r["busy"]:
            checks[:0] = check_targets(r, (*STOCK_TARGETS, *_UNSAFE_TARGETS))
        checks.append(errors_check(r))
        if r["mode"] != "loopbridge":  # the other topology: named beside its scenario
            for check in checks:
                check["scenario"] = f"{r['scenario']} ({r['mode']})"
        out += checks
    return out


def _ms_tick(value: float, _pos: int) -> str:
    return f"{value:g}"


def plot(
    records: Sequence[JobRecord],
    rows: list[dict[str, Any]],
    out_dir: Path,
    title: str,
    meta: dict[str, Any],
) -> list[Path]:
    """latency_cdf.png (e2e, one panel per scenario), latency_itl.png (ITL, streaming
    scenarios) and latency_p99.png (p99 vs concurrency, closed loop).

    All carry the versions that produced them (:func:`versions_line`).
    """
    import matplotlib

    matplotlib.use("Agg")
    out: list[Path] = []
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    if not scenarios:
        return out
    footer = versions_line(meta)
    streamed = list(dict.fromkeys(r["scenario"] for r in rows if r["stream"]))
    for name, metric, panels_of, xlabel in (
        ("latency_cdf.png", "e2e", scenarios, "end-to-end latency (ms)"),
        ("latency_itl.png", "itl", streamed, "inter-token latency (ms)"),
    ):
        if panels_of:
            path = out_dir / name
            _cdf_plot(records, modes, panels_of, (metric, xlabel), (title, footer), path)
            out.append(path)
    closed = [r for r in rows if r.get("rate_fraction") is None]  # closed loop: x = concurrency
    if closed:
        out.append(_p99_plot(closed, modes, out_dir / "latency_p99.png", title, footer))
    return out


def _cdf_plot(
    records: Sequence[JobRecord],
    modes: list[str],
    panels_of: list[str],
    what: tuple[str, str],
    titles: tuple[str, str],
    path: Path,
) -> None:
    """One CDF panel per scenario of ``what`` (``e2e`` or ``itl``, and its axis label),
    one line per mode; ``titles``: the figure's title and footer."""
    import matplotlib.pyplot as plt

    (metric, xlabel), (title, footer) = what, titles
    ncols = min(3, len(panels_of))
    nrows = math.ceil(len(panels_of) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.6 * ncols, 3.8 * nrows), squeeze=False)
    for ax, sc in zip(axes.flat, panels_of):
        for mode in modes:
            xs = sorted(
                x
                for rec in records
                if not rec.warmup and rec.mode == mode and rec.key == sc
                for s in rec.samples
                if s.error is None
                for x in (s.itl if metric == "itl" else (s.e2e,))
            )
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.plot([x * 1e3 for x in xs], ys, label=mode, color=MODE_COLORS.get(mode), lw=1.6)
        ax.set_title(sc)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction")
        ax.axhline(0.99, color="k", lw=0.5, ls=":")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    for ax in list(axes.flat)[len(panels_of) :]:
        ax.set_visible(False)
    fig.suptitle(f"{'ITL' if metric == 'itl' else 'Latency'} CDF per mode: {title}")
    fig.text(0.5, 0.005, footer, ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _p99_plot(
    rows: list[dict[str, Any]], modes: list[str], path: Path, title: str, footer: str
) -> Path:
    """p99 against concurrency, one panel per (busy, streaming, endpoint)."""
    import matplotlib.pyplot as plt

    panels = sorted({_panel_of(r) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        _p99_panel(ax, rows, modes, panel)
    fig.suptitle(f"p99 vs concurrency: {title}")
    fig.text(0.5, 0.005, footer, ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _p99_panel(ax: Any, rows: list[dict[str, Any]], modes: list[str], panel: _Panel) -> None:
    """One panel of :func:`_p99_plot`: its rows' p99s, one line per mode and statistic."""
    import matplotlib.ticker

    busy, own_loop, nostream, endpoint = panel
    mine = [r for r in rows if _panel_of(r) == panel]
    for mode in modes:
        for stat, marker, ls, label in (
            ("e2e_p99", "o", "-", "e2e"),
            ("ttft_p99", "x", "--", "TTFT"),
            ("itl_p99", ".", ":", "ITL"),
        ):
            if nostream and stat != "e2e_p99":
                continue  # the same as e2e without streaming
            pts = sorted((r["concurrency"], r[stat]) for r in mine if r["mode"] == mode)
            if not pts:
                continue
            ax.plot(
                [p[0] for p in pts],
                [p[1] * 1e3 for p in pts],
                marker=marker,
                ls=ls,
                label=f"{mode} {label}",
                color=MODE_COLORS.get(mode),
            )
    ax.set_title(
        f"{'non-streaming' if nostream else 'streaming'}, "
        f"{_loop_title(busy, own_loop)}{', chat' if endpoint == 'chat' else ''}"
    )
    ax.set_xlabel("concurrency (kept-alive connections)")
    ax.set_ylabel("p99 latency (ms, log scale)")
    # Log latency: c = 1 and 16 stay readable next to c = 64, and equal ratios
    # between modes look equal at every concurrency.
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_ms_tick))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xscale("log", base=2)
    cs = sorted({r["concurrency"] for r in mine})
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _loop_title(busy: bool, own_loop: bool) -> str:
    if not busy:
        return "idle owner loop"
    return "busy actor loop, engine on its own" if own_loop else "busy owner loop"


#: A p99 panel: (busy, own loop, not streamed, endpoint).
_Panel = tuple[bool, bool, bool, str]


def _panel_of(r: dict[str, Any]) -> _Panel:
    return (r["busy"], r.get("own_loop", False), not r["stream"], r["endpoint"])
