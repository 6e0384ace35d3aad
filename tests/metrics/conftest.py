from __future__ import annotations

from collections.abc import Iterator

import pytest

from loopbridge.metrics import record_submission_sites


@pytest.fixture
def sites() -> Iterator[None]:
    old = record_submission_sites(True)
    yield
    record_submission_sites(old)
