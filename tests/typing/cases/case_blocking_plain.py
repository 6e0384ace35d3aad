# checkers: mypy pyright
"""Without the mypy plugin, members of the blocking face are Any (for mypy and pyright)."""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

from loopbridge import Blocking, blocking, proxy

from _models import Engine


def plain() -> None:
    b = blocking(proxy(Engine()))
    assert_type(b, Blocking[Engine])
    assert_type(b.generate, Any)
    assert_type(b.generate(1, 2, 3), Any)  # not checked: the face is untyped here
    assert_type(b.missing, Any)
