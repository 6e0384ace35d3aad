"""Make the package's ``vllm.general_plugins`` entry point visible to vLLM.

A clean install (``pip install -e .`` from this checkout) already registers it.
An environment whose editable install predates the entry point does not, so
the tests write a ``.dist-info`` holding exactly the table that
``pyproject.toml`` declares (plus any test-only entry points) into a folder
that they put on the ``PYTHONPATH`` of the processes they start; vLLM's
plugin loader, in each of those processes, then finds it through
``importlib.metadata`` as it would an installed package's.
"""

from __future__ import annotations

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


def expose(folder: Path, extra: dict[str, str] | None = None) -> Path:
    """Write a ``.dist-info`` with what ``pyproject.toml`` declares (if the
    environment lacks it) and ``extra`` into ``folder``.

    Returns ``folder``, to be put on the ``PYTHONPATH`` of the processes that
    should see these entry points (only those: the test process itself is
    left alone).
    """
    wanted = {k: v for k, v in declared().items() if registered().get(k) != v}
    wanted.update(extra or {})
    info = folder / "loopbridge_test_plugins-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: loopbridge-test-plugins\nVersion: 0\n"
    )
    lines = [f"[{GROUP}]"] + [f"{k} = {v}" for k, v in wanted.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return folder
