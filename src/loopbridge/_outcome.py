"""How an operation ended, and whether its caller asked for a cancel: leaf values
shared by operations, wakers and metrics (this module imports nothing of ours)."""

from __future__ import annotations

import enum

__all__ = [
    "Outcome",
    "Cancel",
    "PENDING",
    "OK",
    "ERROR",
    "CANCELLED",
    "NOT_REQUESTED",
    "REQUESTED",
]


class Outcome(enum.Enum):
    """How an operation ended (shared by calls, streams and metrics)."""

    PENDING = "pending"
    OK = "ok"  # returned (a call) or ran to its end (a stream)
    ERROR = "error"  # raised, or the owner loop died
    CANCELLED = "cancelled"

    # Identity hash, a C slot: the counters are keyed by outcome and looked up
    # once per operation, and Enum's own __hash__ is a Python frame.
    __hash__ = object.__hash__


class Cancel(enum.Enum):
    """Whether the caller asked for the owner side to be cancelled."""

    NOT_REQUESTED = "not requested"
    REQUESTED = "requested"


# Module globals: one load each on the hot path instead of two.
PENDING, OK, ERROR, CANCELLED = Outcome.PENDING, Outcome.OK, Outcome.ERROR, Outcome.CANCELLED
NOT_REQUESTED, REQUESTED = Cancel.NOT_REQUESTED, Cancel.REQUESTED
