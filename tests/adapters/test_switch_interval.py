"""The switch interval while threaded servers serve (loopbridge_adapters.switch_interval).

The servers' own use of it is in test_threaded.py; here, the counting between servers
and the refusals, with no server.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import pytest

from loopbridge_adapters.switch_interval import (
    DEFAULT_SWITCH_INTERVAL_S,
    check_switch_interval,
    serving_switch_interval,
)

_LOG = logging.getLogger("test-switch-interval")


@pytest.fixture(autouse=True)
def interpreter_default() -> Iterator[float]:
    """Every test starts from 5 ms and leaves the interval as it found it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield 0.005
    sys.setswitchinterval(before)


@pytest.mark.parametrize("bad", [0, 0.0, -0.001, True, "0.001", float("nan")])
def test_a_bad_setting_is_refused_naming_the_fix(bad: object) -> None:
    with pytest.raises(ValueError, match=r"positive number of seconds .* or None"):
        check_switch_interval(bad)  # type: ignore[arg-type]


def test_good_settings_pass_as_they_are() -> None:
    assert check_switch_interval(None) is None
    assert check_switch_interval(0.002) == 0.002
    assert check_switch_interval(1) == 1


def test_held_while_serving_logged_and_restored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=_LOG.name)
    with serving_switch_interval(DEFAULT_SWITCH_INTERVAL_S, _LOG, "test server"):
        assert sys.getswitchinterval() == DEFAULT_SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == 0.005
    (record,) = caplog.records
    assert record.getMessage() == (
        "test server: the interpreter's switch interval is 1 ms while it serves (it was 5 ms; "
        "switch_interval=None leaves it alone)"
    )


def test_none_touches_nothing() -> None:
    sys.setswitchinterval(0.003)
    with serving_switch_interval(None, _LOG, "test server"):
        assert sys.getswitchinterval() == 0.003
    assert sys.getswitchinterval() == 0.003


def test_the_last_server_to_stop_restores_the_first_ones_saved_interval() -> None:
    first = serving_switch_interval(0.001, _LOG, "first")
    second = serving_switch_interval(0.002, _LOG, "second")
    first.__enter__()
    second.__enter__()
    assert sys.getswitchinterval() == 0.002  # the latest one's
    first.__exit__(None, None, None)
    assert sys.getswitchinterval() == 0.002  # the second one still serves
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == 0.005  # what was there before the first


def test_an_interval_changed_while_serving_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    with serving_switch_interval(0.001, _LOG, "test server"):
        sys.setswitchinterval(0.0002)  # the user's own choice, made while serving
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    assert any(
        "was changed to 0.2 ms while serving; left at that, not restored to 5 ms" in r.getMessage()
        for r in caplog.records
    )


def test_a_failure_in_the_block_still_restores() -> None:
    with pytest.raises(KeyError), serving_switch_interval(0.001, _LOG, "test server"):
        raise KeyError("boom")
    assert sys.getswitchinterval() == 0.005
