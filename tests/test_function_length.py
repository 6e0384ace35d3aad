"""No function in src/ is longer than 80 lines, but for the declarative tables below.

Lengths are scripts/long_functions.py's (``def`` to last line, nested functions
included, the function's own docstring not): ``python scripts/long_functions.py`` lists every function over 60.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
LIMIT = 80

#: Declarative tables may be longer: none is, today.
TABLES: frozenset[str] = frozenset()


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "long_functions", REPO / "scripts" / "long_functions.py"
    )
    assert spec is not None and spec.loader is not None
    module = sys.modules.get("long_functions")
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["long_functions"] = module  # its dataclass looks itself up there
        spec.loader.exec_module(module)
    return module


def _long_functions() -> list[str]:
    return [f"{f.path}:{f.qualname}" for f in _module().longer_than(LIMIT, [REPO / "src"])]


def test_a_docstring_is_not_counted_and_code_is(tmp_path: Path) -> None:
    doc = "\n".join(f"    line {i}" for i in range(100))
    code = "\n".join(f"    x{i} = {i}" for i in range(79))
    source = tmp_path / "m.py"
    source.write_text(
        f'def documented():\n    """{doc}\n    """\n{code}\n\n\ndef long():\n    x = 0\n{code}\n'
    )
    lengths = {f.qualname: f.lines for f in _module().functions([source])}
    assert lengths == {"documented": 80, "long": 81}


def test_no_function_in_src_is_over_80_lines() -> None:
    long = set(_long_functions())
    over = long - TABLES
    assert not over, f"over {LIMIT} lines (split them, or name a declarative table): {over}"
    assert long >= TABLES, f"no longer over {LIMIT} lines, drop from TABLES: {TABLES - long}"
