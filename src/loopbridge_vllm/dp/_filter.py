"""The pause-aware message filter.

The filter sits between a DP engine core's input queue and its request
handler.  For each message it decides, from the rank's pause and consensus
state alone, whether to deliver it, hold it until a stated condition holds,
or drop it.  The logic is pure so that the protocol model (variant ``e``) and
the patch for the real ``DPEngineCoreProc`` run the very same code.

Rules (see ``docs/dp-protocol.md`` for why each is safe):

R1  A ``resume_scheduler`` utility that reaches a rank whose scheduler is not
    paused and that has no pause in flight is answered at once as a no-op
    (dropped with a successful reply).  Resume is a DP barrier; on 0.32 a rank
    decides whether to enter it from ``engines_running``, which differs
    between ranks after a wave has started, so a duplicate resume makes idle
    ranks enter the barrier while running ranks enter a forward.  The pause
    state is identical on every rank once a resume has been handled by all of
    them, so keying on it makes every rank drop the duplicate.

R2  A ``START_DP_WAVE`` that reaches a rank while the consensus latch
    (``ignore_start_dp_wave``) is set is held until the latch clears (resume)
    instead of being dropped.  On 0.32 the front-end's FIRST_REQ path starts
    waves independently of the engines, so a wave start for a request sent
    during the resume can overtake the resume on a peer and be dropped there
    while the target rank, already resumed, steps alone.  Released after the
    resume, the message is judged by the usual wave comparison: a wave that
    has meanwhile ended everywhere is ignored, a current one is joined.

Both rules apply unchanged to 0.33 (variant ``e33``): its resume still
decides from ``engines_running`` (R1 closes vLLM #55229 there too); only
engines start waves, so R2 rarely holds anything, and what it holds is judged
by the same wave comparison after resume.

R3  A ``checkpoint_prepare`` or ``checkpoint_restore`` utility (vLLM 0.34) is
    refused: answered at once with a failure that names the filter, and not
    handled.  ``checkpoint_prepare`` starts a DP pause and replies before the
    drain completes, so the orchestrator's next call can reach a rank whose
    pause is still in flight (precondition P1, one orchestrator that waits for
    every reply, no longer holds); ``checkpoint_restore`` resumes through the
    DP barrier under a name R1 does not match.  Neither path is in the model.

Everything else is delivered unchanged: the consensus latch of the
two-phase pause already drops late ``START_DP_WAVE`` messages, and an ADD
does not arm a paused rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

MessageKind = Literal["ADD", "ABORT", "START_DP_WAVE", "UTILITY", "OTHER"]

RESUME_METHODS = frozenset({"resume_scheduler"})
#: Utilities outside the model, refused on a filtered rank (R3).
REFUSED_METHODS = frozenset({"checkpoint_prepare", "checkpoint_restore"})


class Decision(Enum):
    """What to do with one message."""

    DELIVER = "deliver"
    #: do not handle it; a utility is answered with a successful ``None`` reply
    DROP = "drop"
    #: keep it aside and offer it again after the rank's next busy-loop step
    HOLD = "hold"
    #: do not handle it; a utility is answered with a failure naming the filter
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class FilterView:
    """The part of a rank's state the filter may look at."""

    paused: bool  # scheduler.pause_state != UNPAUSED
    pending_pause: bool
    ignore_start_dp_wave: bool
    engines_running: bool


def decide(kind: MessageKind, method: str | None, view: FilterView) -> Decision:
    """Decide the fate of one message of ``kind`` (``method`` for utilities)."""
    if kind == "START_DP_WAVE" and view.ignore_start_dp_wave:
        return Decision.HOLD  # R2
    if kind == "UTILITY" and method in REFUSED_METHODS:
        return Decision.REFUSE  # R3
    if kind == "UTILITY" and method in RESUME_METHODS:
        in_flight = view.pending_pause or view.ignore_start_dp_wave
        if not view.paused and not in_flight:
            return Decision.DROP  # R1
    return Decision.DELIVER
