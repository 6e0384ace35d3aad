"""The recipes of docs/recipes.md as modules, for the tests and the benchmark.

A recipe is the page's blocks marked ``<!-- snippet: recipe because ...; name:
NAME -->``, in page order: what the tests and benchmarks/bench_recipes_servers.py
run is exactly what the page shows.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

PAGE = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
_RECIPE = re.compile(r"^<!-- snippet: recipe because [^;]+; name: (?P<name>[\w-]+) -->$")


def load_recipe(name: str) -> ModuleType:
    """The recipe ``name`` as a module (``recipe_<name>``), executed once."""
    modname = f"recipe_{name}"
    module = sys.modules.get(modname)
    if module is None:
        lines = PAGE.read_text().splitlines()
        blocks = []
        for i, line in enumerate(lines):
            m = _RECIPE.match(line)
            if m is not None and m["name"] == name:
                end = lines.index("```", i + 2)
                blocks.append("\n".join(lines[i + 2 : end]))
        assert blocks, f"no recipe named {name!r} in {PAGE.name}"
        module = ModuleType(modname)
        module.__file__ = f"{PAGE}#{name}"
        sys.modules[modname] = module  # dataclasses and pickling look it up
        source = "\n\n".join(blocks) + "\n"
        exec(compile(source, f"<docs/recipes.md: {name}>", "exec"), vars(module))
    return module
