"""Make the package's ``vllm.general_plugins`` entry point visible to vLLM.

A clean install (``pip install -e .`` from this checkout) already registers it.
An environment whose editable install predates the entry point does not, so
the tests write a ``.dist-info`` holding exactly the table that
``pyproject.toml`` declares (plus any test-only entry points) into a folder
that they put on ``sys.path`` and ``PYTHONPATH``; vLLM's plugin loader, in
every process, then finds it through ``importlib.metadata`` as it would an
installed package's.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[2]
GROUP = "vllm.general_plugins"


def declared() -> dict[str, str]:
    """The ``vllm.general_plugins`` table of ``pyproject.toml``."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    table: dict[str, str] = data["project"]["entry-points"][GROUP]
    return table


def registered() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def expose(folder: Path, extra: dict[str, str] | None = None) -> Path | None:
    """Register what ``pyproject.toml`` declares (if missing) and ``extra``.

    Returns the folder added to the import path, or None when nothing needed
    adding.
    """
    wanted = {k: v for k, v in declared().items() if registered().get(k) != v}
    wanted.update(extra or {})
    if not wanted:
        return None
    info = folder / "loopbridge_test_plugins-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: loopbridge-test-plugins\nVersion: 0\n"
    )
    lines = [f"[{GROUP}]"] + [f"{k} = {v}" for k, v in wanted.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    path = str(folder)
    if path not in sys.path:
        sys.path.insert(0, path)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if path not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([path, *parts])
    return folder
