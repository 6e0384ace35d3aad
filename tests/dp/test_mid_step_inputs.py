"""vLLM 0.34's input handling during a forward cannot reorder what the filter relies on.

From 0.34, ``EngineCoreProc._wait_for_output`` takes inputs while a step's
output is pending, when the executor's future has ``poll`` and
``wait_briefly`` (the multiprocessing executor's do; the stand-in's do not):
ADD, ABORT, EXECUTOR_FAILED and WAKEUP are handled at once, and the first input
of any other kind (UTILITY, START_DP_WAVE) is deferred, which ends the mid-step
intake; deferred inputs are handled first after the step. What the filter needs
from that, shown here on a real 0.34 rank with such a future:

1. every input still reaches the filter (``self._handle_client_request`` is the
   class attribute the filter wraps), in arrival order;
2. no UTILITY or START_DP_WAVE is handled during a step, so the pause state and
   the consensus latch the filter reads change between steps only, as in the model;
3. an ADD handled mid-step never releases a held START_DP_WAVE: one is held only
   while the latch is set, and only a resume (a UTILITY) clears the latch.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from test_conformance import RealRank
from vllm.v1.engine import EngineCoreRequestType as T
from vllm.v1.engine.core import DPEngineCoreProc

from loopbridge_vllm.dp import _patch

pytestmark = pytest.mark.skipif(
    not hasattr(DPEngineCoreProc, "_wait_for_output"),
    reason="this vLLM has no mid-step input handling (0.34 adds it)",
)


class PollingFuture(Future[Any]):
    """A step's output future with the multiprocessing executor's two probes:
    ``poll`` says not yet ``ready_after`` times (the output itself is there, so
    that ``result()`` never blocks the test)."""

    def __init__(self, ready_after: int) -> None:
        super().__init__()
        self.polls_left = ready_after
        self.set_result("output")

    def poll(self) -> bool:
        if self.polls_left == 0:
            return True
        self.polls_left -= 1
        return False

    def wait_briefly(self, pending: Any, deadline: float) -> None:
        return None  # the inputs are queued already: nothing to wait for


@pytest.fixture
def handled() -> Iterator[list[tuple[Any, str]]]:
    """What vLLM's own handler was given, in order, under the filter."""
    seen: list[tuple[Any, str]] = []
    original = DPEngineCoreProc.__dict__["_handle_client_request"]

    def recording(self: Any, request_type: Any, request: Any) -> None:
        seen.append((request_type, _name(request_type, request)))
        original(self, request_type, request)

    DPEngineCoreProc._handle_client_request = recording  # type: ignore[method-assign]
    try:
        assert _patch.install_filter()
        yield seen
    finally:
        _patch.uninstall_filter()
        DPEngineCoreProc._handle_client_request = original  # type: ignore[method-assign]


def _name(request_type: Any, request: Any) -> str:
    if request_type == T.ADD:
        return f"add:{request[0].request_id}"
    if request_type == T.UTILITY:
        return f"utility:{request[2]}"
    if request_type == T.START_DP_WAVE:
        return f"wave:{request[0]}"
    return str(request_type)


def _add(rid: str) -> tuple[Any, Any]:
    from test_conformance import to_real

    import loopbridge_bench.dp_check._model as m

    return to_real(m.Add(req=int(rid), wave=0))


def test_inputs_reach_the_filter_in_arrival_order(handled: list[tuple[Any, str]]) -> None:
    rr = RealRank(0, 2)
    arrivals = [
        _add("1"),
        (T.UTILITY, (0, 1, "pause_scheduler", ("keep", False))),
        _add("2"),
        (T.START_DP_WAVE, (5, -1)),
    ]
    for msg in arrivals:
        rr.e.input_queue.put_nowait(msg)
    assert rr.e._wait_for_output(PollingFuture(ready_after=10)) == "output"
    # During the step: the first ADD only; the pause is deferred and ends the intake.
    assert handled == [(T.ADD, "add:1")]
    assert [_name(*msg) for msg in rr.e._deferred_inputs] == ["utility:pause_scheduler"]
    assert rr.e.input_queue.qsize() == 2
    # After the step: the deferred pause first, then what is still queued, in order.
    rr.e._process_input_queue()
    assert [name for _, name in handled] == [
        "add:1",
        "utility:pause_scheduler",
        "add:2",
        "wave:5",
    ]


def test_no_utility_or_wave_start_is_handled_during_a_step(
    handled: list[tuple[Any, str]],
) -> None:
    rr = RealRank(0, 2)
    for msg in [(T.START_DP_WAVE, (3, -1)), _add("1"), _add("2")]:
        rr.e.input_queue.put_nowait(msg)
    rr.e._wait_for_output(PollingFuture(ready_after=10))
    assert handled == []  # the wave start came first: deferred, nothing handled mid-step
    assert rr.e.input_queue.qsize() == 2


def test_a_mid_step_add_does_not_release_a_held_wave_start(
    handled: list[tuple[Any, str]],
) -> None:
    rr = RealRank(1, 2)
    rr.e.ignore_start_dp_wave = True  # pause consensus reached: the latch is set
    rr.e._handle_client_request(T.START_DP_WAVE, (1, 0))  # between steps: held (R2)
    assert len(rr.e._loopbridge_held) == 1 and handled == []
    rr.e.input_queue.put_nowait(_add("7"))
    rr.e._wait_for_output(PollingFuture(ready_after=3))
    assert [name for _, name in handled] == ["add:7"]
    assert len(rr.e._loopbridge_held) == 1  # still held: only a resume clears the latch
