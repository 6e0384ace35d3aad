"""Exhaustive explicit-state search over the protocol model.

Breadth-first search over canonical states (waves shifted to start at 0, step
counters folded), so the first violation of each kind is reached by a
shortest path.  The reduction is the one described in
:func:`._model.successors`: completing a collective and firing idle
callbacks are forced, which keeps every quiescent state reachable.

A state is *quiescent* when nothing but the client's optional actions
(sending another request or an abort) is enabled: no rank can move, no
message is in flight.  Properties are checked there:

* deadlock: every rank is blocked in a collective, not all in the same one;
* hang: some rank is blocked in a collective that a peer never enters;
* stuck utility: the client waits for a reply that never comes;
* lost request: a request the engine accepted is neither finished nor
  aborted nor rejected;

and on every state: a utility that failed (``resume_scheduler`` raising).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ._model import (
    IN_ENGINE,
    Config,
    Label,
    World,
    canonical,
    initial,
    is_optional,
    successors,
)
from ._timeline import render


@dataclass(frozen=True)
class Violation:
    kind: str  # deadlock, hang, stuck-utility, lost-request, utility-error
    detail: str
    trace: tuple[Label, ...]
    state: World
    #: whether more client traffic (within the bounds) can still resolve it
    heals: bool | None = None
    #: the worlds along ``trace``, starting with the initial one (not canonicalised)
    path: tuple[World, ...] = ()

    def timeline(self, ranks: int) -> str:
        return render(self.trace, ranks)


@dataclass
class Result:
    config: Config
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    complete: bool = True  # False when max_states cut the search short
    violations: dict[str, Violation] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        cfg = self.config
        head = (
            f"variant {cfg.variant.name} ({cfg.variant.description}); ranks={cfg.ranks} "
            f"requests={cfg.requests} req_len={cfg.req_len} when={cfg.when} "
            f"pauses={cfg.pauses} mode={cfg.mode} weight_updates={cfg.weight_updates} "
            f"resumes={cfg.resumes} aborts={cfg.aborts} sync_interval={cfg.sync_interval}"
            f"{' prompt_first_req' if cfg.prompt_first_req else ''}"
            f"{f' pause_targets={cfg.pause_targets}' if cfg.pause_targets else ''}"
        )
        verdict = "no violation" if self.ok else ", ".join(sorted(self.violations))
        if not self.complete:
            verdict += " (search cut short by max_states)"
        return (
            f"{head}\n  {self.states} states, {self.transitions} transitions, "
            f"{self.seconds:.2f} s: {verdict}"
        )


def classify(cfg: Config, w: World, quiescent: bool) -> tuple[str, str] | None:
    """The violation ``w`` exhibits, if any."""
    if w.client.errors:
        return "utility-error", "; ".join(w.client.errors)
    if not quiescent:
        return None
    blocked = [(i, r.blocked.kind) for i, r in enumerate(w.ranks) if r.blocked]
    if blocked:
        where = ", ".join(f"r{i} in {k}" for i, k in blocked)
        if len(blocked) == len(w.ranks):
            return "deadlock", f"ranks blocked in different collectives: {where}"
        idle = ", ".join(f"r{i}" for i, r in enumerate(w.ranks) if not r.blocked)
        return "hang", f"{where}; {idle} never join(s)"
    c = w.client
    if c.waiting or c.stage < len(cfg.script):
        return "stuck-utility", f"client waits for ranks {sorted(c.waiting)} forever"
    lost = [i for i, s in enumerate(c.req_status) if s == IN_ENGINE]
    if lost:
        return "lost-request", f"requests {lost} accepted but never finished"
    return None


def check(
    cfg: Config,
    max_states: int = 2_000_000,
    stop_at_first: bool = False,
    heal_check: bool = True,
) -> Result:
    """Explore every interleaving of ``cfg`` and report violations."""
    t0 = time.perf_counter()
    res = Result(cfg)
    start = canonical(initial(cfg), cfg.symmetric)
    parent: dict[World, tuple[World, Label] | None] = {start: None}
    queue: deque[World] = deque([start])
    while queue:
        w = queue.popleft()
        succ = successors(cfg, w)
        res.transitions += len(succ)
        quiescent = all(is_optional(label) for label, _ in succ)
        found = classify(cfg, w, quiescent)
        if found is not None and found[0] not in res.violations:
            kind, detail = found
            labels, worlds = _trace(cfg, parent, w)
            res.violations[kind] = Violation(kind, detail, labels, w, path=worlds)
            if stop_at_first:
                break
        if found is not None and found[0] == "utility-error":
            continue  # the orchestrator would stop here
        for label, nxt in succ:
            nxt = canonical(nxt, cfg.symmetric)
            if nxt not in parent:
                parent[nxt] = (w, label)
                queue.append(nxt)
        if len(parent) >= max_states:
            res.complete = False
            break
    res.states = len(parent)
    if heal_check:
        for kind, v in list(res.violations.items()):
            if kind != "utility-error":
                res.violations[kind] = _with_heal(cfg, v, max_states)
    res.seconds = time.perf_counter() - t0
    return res


def _trace(
    cfg: Config, parent: dict[World, tuple[World, Label] | None], w: World
) -> tuple[tuple[Label, ...], tuple[World, ...]]:
    """The path to ``w``, replayed without canonicalisation so waves read naturally."""
    path: list[World] = [w]
    while (link := parent[path[-1]]) is not None:
        path.append(link[0])
    path.reverse()
    labels: list[Label] = []
    cur = initial(cfg)
    worlds = [cur]
    for target in path[1:]:
        for label, nxt in successors(cfg, cur):
            if canonical(nxt, cfg.symmetric) == target:
                labels.append(label)
                worlds.append(nxt)
                cur = nxt
                break
        else:  # pragma: no cover - the parent map came from these successors
            raise AssertionError("trace replay diverged")
    return tuple(labels), tuple(worlds)


def _with_heal(cfg: Config, v: Violation, max_states: int) -> Violation:
    """Can later client traffic (within the bounds) bring the system to a clean end?"""
    start = v.state
    seen = {start}
    queue: deque[World] = deque([start])
    while queue and len(seen) < max_states:
        w = queue.popleft()
        succ = successors(cfg, w)
        quiescent = all(is_optional(label) for label, _ in succ)
        if quiescent and classify(cfg, w, True) is None:
            return Violation(v.kind, v.detail, v.trace, v.state, True, v.path)
        for _, nxt in succ:
            nxt = canonical(nxt, cfg.symmetric)
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return Violation(v.kind, v.detail, v.trace, v.state, False, v.path)
