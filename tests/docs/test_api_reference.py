"""The public face: docs/api.md documents exactly each public module's ``__all__``,
and ``import loopbridge`` stays free of the optional parts.  (Types users must not
build refuse construction: tests/core/test_construction.py.)"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import loopbridge

ROOT = Path(__file__).resolve().parents[2]
SRC = str(Path(loopbridge.__file__).resolve().parent.parent)

PUBLIC = (
    "loopbridge",
    "loopbridge.metrics",
    "loopbridge.metrics.prometheus",
    "loopbridge.sanitizer",
)

_MODULE = re.compile(r"^## Module `([\w.]+)`")
# An entry is a heading that starts with the name, e.g. "#### `class Site`",
# "#### `@loop_affine` / ...", "#### `snapshot() -> dict`".
_ENTRY = re.compile(r"^#{3,4} `(?:class |@)?(\w+)")


def documented() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    module: str | None = None
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        if line.startswith("## "):
            m = _MODULE.match(line)
            module = m.group(1) if m else None
            if module is not None:
                out[module] = set()
        elif module is not None and (m := _ENTRY.match(line)):
            out[module].add(m.group(1))
    return out


def test_api_md_has_a_section_per_public_module() -> None:
    assert sorted(documented()) == sorted(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_api_md_matches_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    docs = documented()[name]
    assert not exported - docs, f"exported by {name} but not documented in docs/api.md"
    assert not docs - exported, f"documented under {name} in docs/api.md but not exported"
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which is missing"


def _modules_after(code: str, env: dict[str, str] | None = None) -> set[str]:
    script = f"{code}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": SRC, **(env or {})},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return set(out.split())


def test_import_loopbridge_loads_neither_sanitizer_nor_observability_extras() -> None:
    loaded = _modules_after("import loopbridge")
    assert not {m for m in loaded if m.startswith("loopbridge.sanitizer")}
    assert "loopbridge.metrics.prometheus" not in loaded
    assert "prometheus_client" not in loaded


def test_sanitizer_patches_load_only_when_switched_on() -> None:
    assert "loopbridge.sanitizer._instrument" not in _modules_after("import loopbridge.sanitizer")
    on = _modules_after("import loopbridge", {"LOOPBRIDGE_SANITIZE": "warn"})
    assert "loopbridge.sanitizer._instrument" in on
