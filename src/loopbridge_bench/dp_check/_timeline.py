"""Render a counterexample as a timeline: one column per rank, coordinator, client."""

from __future__ import annotations

import textwrap

Label = tuple[str, str]

_WIDTH = 24


def render(trace: tuple[Label, ...] | list[Label], ranks: int) -> str:
    """One row per action; collective completions ("*") span every rank column."""
    actors = [f"r{i}" for i in range(ranks)] + ["coord", "client"]
    col = {a: i for i, a in enumerate(actors)}
    header = "  # | " + " | ".join(a.ljust(_WIDTH) for a in actors)
    lines = [header, "-" * len(header)]
    for n, (actor, text) in enumerate(trace, 1):
        cells: list[list[str]] = [[] for _ in actors]
        targets = range(ranks) if actor == "*" else [col[actor]]
        for t in targets:
            cells[t] = textwrap.wrap(text, _WIDTH) or [""]
        height = max(len(c) for c in cells)
        for k in range(height):
            row = [(c[k] if k < len(c) else "").ljust(_WIDTH) for c in cells]
            num = f"{n:3d}" if k == 0 else "   "
            lines.append(f"{num} | " + " | ".join(row).rstrip())
    return "\n".join(lines)
