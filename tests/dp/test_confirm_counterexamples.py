"""Every violation the checker reports for vLLM 0.32.0 (variant ``c``),
replayed on real ``DPEngineCoreProc`` ranks.

Each real rank is fed exactly the messages its model counterpart handled, in
the same order and at the same points between collectives, and each
collective completes with the contributions the model's peers made.  When the
trace runs out, a collective with no partner and a read from an empty input
queue raise :class:`Stuck`.  The real ranks must end where the model's do:
blocked in the same collective, or idle with nothing to do.
"""

from __future__ import annotations

import contextlib
import queue
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed
import vllm.config.parallel as parallel
from test_conformance import FILTERED, PLAIN, RealRank, project_model, project_real, to_real

from loopbridge_bench.dp_check import VARIANTS, Config, Violation, check
from loopbridge_bench.dp_check import _model as m


class Stuck(BaseException):
    """The real rank waits for something the trace never provides."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class TraceQueue(queue.Queue):  # type: ignore[type-arg]
    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and self.empty():
            raise Stuck("input")
        return super().get(block, timeout)


def per_rank_script(v: Violation, i: int) -> tuple[list[Any], list[tuple[str, list[Any]]]]:
    """(message segments, collectives with peer contributions) for rank ``i``."""
    segments: list[list[m.InMsg]] = [[]]
    collectives: list[tuple[str, list[Any]]] = []
    for prev, nxt in zip(v.path, v.path[1:]):
        a, b = prev.ranks[i], nxt.ranks[i]
        if a.blocked is not None and b.blocked != a.blocked:
            peers = [r.blocked for j, r in enumerate(prev.ranks) if j != i]
            collectives.append((a.blocked.kind, peers))
            segments.append([])
        if len(b.cin) < len(a.cin) + _appended(prev, nxt, i, "cin"):
            segments[-1].append(a.cin[0])
        if len(b.coin) < len(a.coin) + _appended(prev, nxt, i, "coin"):
            segments[-1].append(a.coin[0])
    return segments, collectives


def _appended(prev: m.World, nxt: m.World, i: int, chan: str) -> int:
    # Others may append to a channel in the same action that nothing consumes.
    a, b = getattr(prev.ranks[i], chan), getattr(nxt.ranks[i], chan)
    if len(b) >= len(a) and b[: len(a)] == a:
        return len(b) - len(a)
    return len(b) - len(a) + 1 if b[: len(a) - 1] == a[1:] and len(b) >= len(a) - 1 else 0


def replay_rank(
    v: Violation, i: int, size: int, req_len: int, variant: m.Variant
) -> tuple[str, RealRank]:
    segments, collectives = per_rank_script(v, i)
    rr = RealRank(i, size, req_len)
    e = rr.e
    e.input_queue = TraceQueue()
    e.process_input_queue_block = True
    todo = list(collectives)
    seg_iter = iter(segments)

    def feed() -> None:
        for msg in next(seg_iter, []):
            e.input_queue.put_nowait(to_real(msg, variant))

    def collective(kind: str) -> list[Any]:
        if not todo:
            raise Stuck(kind)
        want, peers = todo.pop(0)
        assert want == kind, f"rank {i}: real enters {kind}, model {want}"
        feed()
        return peers

    def all_reduce(
        tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False
    ) -> None:
        if op == torch.distributed.ReduceOp.MAX:
            for p in collective("barrier"):
                tensor[0] = max(int(tensor[0]), int(p.unfinished))
        else:
            for p in collective("sync"):
                tensor[0] += int(p.unfinished)
                tensor[1] += int(p.pending)

    def forward() -> tuple[dict[int, Any], bool]:
        if not e.scheduler.has_unfinished_requests():
            return {}, False
        collective("fwd")
        e.scheduler.forward()
        return {}, True

    e.step_fn = forward
    e.model_executor.execute_dummy_batch = lambda: collective("fwd")

    def rpc(method: str, *a: Any, **k: Any) -> None:
        if method != "synchronize_device":  # rank-local
            collective("rpc")

    e.model_executor.collective_rpc = rpc

    def cpu_all_reduce(tensor: torch.Tensor, group: Any, timeout: Any = None) -> torch.Tensor:
        all_reduce(tensor, group=group)  # 0.33's finish sync (SUM)
        return tensor

    feed()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.distributed, "all_reduce", all_reduce))
        stack.enter_context(mock.patch.object(e, "_handle_shutdown", lambda: True, create=True))
        if hasattr(parallel, "cpu_all_reduce_"):
            stack.enter_context(mock.patch.object(parallel, "cpu_all_reduce_", cpu_all_reduce))
        try:
            e.run_busy_loop()
        except Stuck as s:
            return s.kind, rr
    raise AssertionError("the busy loop returned")


def confirm(v: Violation, cfg: Config) -> list[str]:
    size, req_len = cfg.ranks, cfg.req_len
    final = v.path[-1]
    ends = []
    for i in range(size):
        kind, rr = replay_rank(v, i, size, req_len, cfg.variant)
        b = final.ranks[i].blocked
        assert kind == (b.kind if b else "input"), f"rank {i}: real {kind}, model {b}"
        assert project_real(rr) == project_model(final.ranks[i]), f"rank {i}"
        ends.append(kind)
    return ends


C032 = [
    pytest.param(dict(prompt_first_req=True), "hang", id="resume-window-wave-start-lost"),
    pytest.param(dict(prompt_first_req=True, resumes=2), "deadlock", id="duplicate-resume"),
    pytest.param(dict(pauses=0, requests=2), "hang", id="no-pause-starved-stats-task"),
    pytest.param(
        dict(pauses=0, aborts=1, prompt_first_req=True), "hang", id="no-pause-abort-before-step"
    ),
    pytest.param(dict(), "hang", id="default-bounds"),
    # A pause that reaches only some ranks: an API server that manages only
    # its own engines (hybrid/external LB), or servers paused one at a time.
    pytest.param(
        dict(prompt_first_req=True, pause_targets=((0,),)), "hang", id="subset-pause-one-server"
    ),
    pytest.param(
        dict(prompt_first_req=True, pause_targets=((0,), (1,))),
        "hang",
        id="subset-pause-one-after-another",
    ),
]


# 0.33.0: of the above, only the duplicate resume (vLLM #55229) and the
# subset pause remain (see docs/dp-protocol.md, the 0.33 column).
C033 = [
    p
    for p in C032
    if p.id in ("duplicate-resume", "subset-pause-one-server", "subset-pause-one-after-another")
]


@pytest.mark.parametrize(("bounds", "kind"), C032 if PLAIN == "c" else C033)
def test_real_reproduces_counterexample(bounds: dict[str, Any], kind: str) -> None:
    cfg = Config(VARIANTS[PLAIN], **bounds)
    res = check(cfg, heal_check=False)
    v = res.violations[kind]
    ends = confirm(v, cfg)
    print(f"{kind}: real ranks end in {ends}\n{v.timeline(cfg.ranks)}")
    assert len(set(ends)) > 1  # the ranks are split: not all in one collective


@pytest.mark.parametrize("targets", [((0,),), ((0,), (1,))], ids=["one-server", "sequential"])
def test_real_with_filter_still_hangs_on_a_subset_pause(targets: Any) -> None:
    """The filter cannot help: the paused rank is kicked into a dummy forward
    by vLLM's own two-phase pause, and the rank that got no pause has no
    message to hold or release that would wake it."""
    from loopbridge_vllm.dp import _patch

    cfg = Config(VARIANTS[FILTERED], prompt_first_req=True, pause_targets=targets)
    v = check(cfg, heal_check=False).violations["hang"]
    assert _patch.install_filter()
    try:
        ends = confirm(v, cfg)
    finally:
        _patch.uninstall_filter()
    assert ends == ["fwd", "input"]


def test_replay_rejects_a_trace_the_real_code_cannot_follow() -> None:
    """Control: variant (a)'s idle fast-path deadlock is not 0.32.0 behaviour."""
    cfg = Config(VARIANTS["a"])
    v = check(cfg, heal_check=False).violations["deadlock"]
    with pytest.raises(AssertionError):
        confirm(v, cfg)
