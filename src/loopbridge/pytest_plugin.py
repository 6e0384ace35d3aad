"""pytest plugin: run a test suite, or single tests, under the loopbridge sanitizer.

* ``--loopbridge-sanitize=raise|warn|log|off`` on the command line, or the ini
  option ``loopbridge_sanitize``, turns it on for the whole session (from
  configuration on, so module-level and session fixtures are covered).
* ``@pytest.mark.loopbridge_sanitize`` (policy ``"raise"``) or
  ``@pytest.mark.loopbridge_sanitize("warn")`` turns it on for one test;
  ``("off")`` exempts a test from a session-wide setting.

Under ``raise`` a test with any misuse fails, even when the
:class:`SanitizerError` was raised in another thread or swallowed by an event
loop's exception handler: the plugin checks what was reported during the test.

The sanitizer's patches are imported and applied only when something turns it
on, so the plugin costs nothing to suites that do not use it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .sanitizer import Policy, sanitize
from .sanitizer._report import POLICIES

_SESSION = pytest.StashKey[sanitize]()
_POLICY = pytest.StashKey[Policy]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loopbridge")
    group.addoption(
        "--loopbridge-sanitize",
        dest="loopbridge_sanitize",
        default=None,
        choices=POLICIES,
        metavar="POLICY",
        help="run every test under the loopbridge affinity sanitizer: "
        "raise, warn, log or off (default: the loopbridge_sanitize ini option)",
    )
    parser.addini(
        "loopbridge_sanitize",
        default="off",
        help="loopbridge affinity sanitizer policy for every test: raise, warn, log or off",
    )


def _policy(value: object, where: str) -> Policy:
    text = str(value).strip().lower()
    if text not in POLICIES:
        raise pytest.UsageError(f"{where}: expected one of {', '.join(POLICIES)}, got {value!r}")
    return text


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "loopbridge_sanitize(policy='raise'): run this test under the loopbridge "
        "affinity sanitizer (policy raise, warn, log, or off to exempt it)",
    )
    option = config.getoption("loopbridge_sanitize")
    policy = (
        _policy(option, "--loopbridge-sanitize")
        if option is not None
        else _policy(config.getini("loopbridge_sanitize"), "ini option loopbridge_sanitize")
    )
    config.stash[_POLICY] = policy
    if policy != "off":
        block = sanitize(policy)
        block.__enter__()
        config.stash[_SESSION] = block


def pytest_unconfigure(config: pytest.Config) -> None:
    block = config.stash.get(_SESSION, None)
    if block is not None:
        del config.stash[_SESSION]
        block.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def _loopbridge_sanitizer(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("loopbridge_sanitize")
    if marker is not None:
        raw = marker.args[0] if marker.args else marker.kwargs.get("policy", "raise")
        policy = _policy(raw, f"{request.node.nodeid}: loopbridge_sanitize marker")
    else:
        policy = request.config.stash.get(_POLICY, "off")
    if policy == "off" and request.config.stash.get(_SESSION, None) is None:
        yield
        return
    with sanitize(policy) as block:
        yield
    if policy == "raise" and block.reports:
        first = block.reports[0]
        more = len(block.reports) - 1
        pytest.fail(
            f"loopbridge sanitizer found {len(block.reports)} misuse(s) in this test"
            + (f" (first shown, {more} more)" if more else "")
            + f":\n{first}",
            pytrace=False,
        )
