"""Test-only vLLM general plugin: two utilities that make DP races forcible.

Loaded in each engine-core process of the real DP group tests (next to the
package's own ``loopbridge_dp_filter`` plugin, never instead of it):

* ``loopbridge_probe()`` returns the rank's DP state;
* ``loopbridge_gate(kind, timeout_s, started_path)`` touches ``started_path``
  and then blocks the rank's busy loop until a
  message of ``kind`` (an ``EngineCoreRequestType`` name) is waiting in its
  input queue.  Messages that arrive meanwhile queue up behind each other in
  arrival order, so "message X reaches this rank before message Y" becomes a
  fact the test can wait for instead of a timing accident.

With ``LOOPBRIDGE_TEST_UNREPORTED_RANK=R`` it also makes rank R skip the
filter's start-up report (P5), as a rank without the filter would: the group
is then a mixed one, which the check must stop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

GATE_POLL_S = 0.005


def _probe(self: Any) -> dict[str, Any]:
    return {
        "rank": int(self.dp_rank),
        "running": bool(self.engines_running),
        "wave": int(self.current_wave),
        "step": int(self.step_counter),
        "pause": int(self.scheduler.pause_state),
        "pending_pause": bool(self.pending_pause),
        "ignore_start_dp_wave": bool(self.ignore_start_dp_wave),
        "unfinished": bool(self.scheduler.has_unfinished_requests()),
        "requests": int(self.scheduler.get_num_unfinished_requests()),
        "held": len(self.__dict__.get("_loopbridge_held", ())),
    }


def _gate(self: Any, kind: str, timeout_s: float, started_path: str) -> bool:
    Path(started_path).touch()  # the caller waits for this before racing
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with self.input_queue.mutex:
            queued = [getattr(t, "name", str(t)) for t, _ in self.input_queue.queue]
        if kind in queued:
            return True
        time.sleep(GATE_POLL_S)
    return False


UNREPORTED_ENV = "LOOPBRIDGE_TEST_UNREPORTED_RANK"


def _skip_report_on(rank: int) -> None:
    from loopbridge_vllm.dp import _patch

    check = _patch.check_group

    def check_group(engine: Any, timeout_s: float | None = None) -> None:
        if int(engine.dp_rank) != rank:
            check(engine, timeout_s)

    # The filter's busy-loop wrapper looks the function up when it runs.
    _patch.check_group = check_group  # type: ignore[assignment]


def load() -> None:
    import os

    from vllm.v1.engine.core import DPEngineCoreProc

    DPEngineCoreProc.loopbridge_probe = _probe  # type: ignore[attr-defined]
    DPEngineCoreProc.loopbridge_gate = _gate  # type: ignore[attr-defined]
    if os.environ.get(UNREPORTED_ENV):
        _skip_report_on(int(os.environ[UNREPORTED_ENV]))
