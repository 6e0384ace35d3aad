"""Where a server can't be started, the reason says what is missing and how to get it
(the fixtures turn it into the skip reason)."""

from __future__ import annotations

import pytest

from . import launch


def test_missing_packages_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    monkeypatch.setattr(launch.glob, "glob", lambda pattern: [])
    postgres_missing = pytest.raises(launch.ServerUnavailable, match="apt-get install postgresql")
    with postgres_missing, launch.postgres():
        pass
    redis_missing = pytest.raises(launch.ServerUnavailable, match="apt-get install redis-server")
    with redis_missing, launch.redis():
        pass
