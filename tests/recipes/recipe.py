"""Load a recipe of docs/recipes.md as a module: the blocks marked
``<!-- snippet: recipe because ...; name: NAME -->``, in page order, are the
module's source.  So what the tests run is exactly what the page shows."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
_MARKER = re.compile(r"^<!-- snippet: recipe because [^;]+; name: (?P<name>[\w-]+) -->$")


def recipe_source(name: str, page: Path = PAGE) -> str:
    lines = page.read_text().splitlines()
    blocks: list[str] = []
    for i, line in enumerate(lines):
        m = _MARKER.match(line)
        if m is None or m["name"] != name:
            continue
        assert lines[i + 1] == "```python", f"{page.name}:{i + 1}: marker not followed by python"
        end = lines.index("```", i + 2)
        blocks.append("\n".join(lines[i + 2 : end]))
    assert blocks, f"no recipe named {name!r} in {page.name}"
    return "\n\n".join(blocks) + "\n"


def load_recipe(name: str) -> types.ModuleType:
    """The recipe ``name`` as a module (``recipe_<name>``), executed once."""
    modname = f"recipe_{name}"
    module = sys.modules.get(modname)
    if module is None:
        module = types.ModuleType(modname)
        module.__file__ = f"{PAGE}#{name}"
        sys.modules[modname] = module  # dataclasses and pickling look it up
        code = compile(recipe_source(name), f"<docs/recipes.md: {name}>", "exec")
        exec(code, module.__dict__)
    return module
