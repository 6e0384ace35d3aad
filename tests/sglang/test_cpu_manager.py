"""The SGLang stand-in scheduler's cadence (``loopbridge_sglang.cpu_manager``).

The clock is passed in, so each case is exact: no sleeping, no timing. The times are
binary fractions, so every sum is exact too.
"""

from __future__ import annotations

import math

from loopbridge_sglang.cpu_manager import _HELD_POLL_MS, _Cadence

STEP = 0.25


def test_idle_waits_for_a_message_without_a_timeout() -> None:
    cadence = _Cadence(STEP)
    assert cadence.wait_ms(busy=False, held=False, now=1.0) is None
    assert cadence.due is None


def test_a_request_to_an_idle_stand_in_gets_its_first_step_one_step_later() -> None:
    cadence = _Cadence(STEP)
    assert not cadence.step_now(10.0)  # arrived now: a step takes STEP
    assert cadence.wait_ms(busy=True, held=False, now=10.125) == 125
    assert cadence.step_now(10.25)


def test_a_message_during_the_wait_never_brings_the_step_forward() -> None:
    """The stand-in handles every message as it comes; the step stays where it was, as a
    forward pass does not end sooner because requests arrive."""
    cadence = _Cadence(STEP)
    assert not cadence.step_now(10.0)
    for now in (10.0625, 10.125, 10.1875):  # one message after another, each handled
        assert not cadence.step_now(now)
        assert cadence.wait_ms(busy=True, held=False, now=now) == math.ceil((10.25 - now) * 1000)
    assert cadence.step_now(10.25)
    assert not cadence.step_now(10.3125)  # the next one is a whole step after it
    assert cadence.wait_ms(busy=True, held=False, now=10.3125) == 188  # 187.5, rounded up
    assert cadence.step_now(10.5)


def test_a_held_stand_in_polls_and_steps_at_once_when_released() -> None:
    cadence = _Cadence(STEP)
    assert not cadence.step_now(10.0)
    assert cadence.wait_ms(busy=True, held=True, now=11.0) == _HELD_POLL_MS
    assert cadence.step_now(12.0)  # released after its step was due: steps now
    assert not cadence.step_now(12.125)


def test_going_idle_forgets_the_step_and_the_next_request_waits_a_whole_step() -> None:
    cadence = _Cadence(STEP)
    assert not cadence.step_now(10.0)
    assert cadence.step_now(10.25)
    assert cadence.wait_ms(busy=False, held=False, now=10.5) is None  # finished: idle
    assert not cadence.step_now(20.0)
    assert cadence.wait_ms(busy=True, held=False, now=20.0) == 250


def test_step_zero_steps_as_fast_as_the_messages_go() -> None:
    cadence = _Cadence(0.0)
    assert cadence.step_now(1.0)
    assert cadence.step_now(1.0)
    assert cadence.wait_ms(busy=True, held=False, now=1.0) == 0
